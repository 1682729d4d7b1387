"""gRPC gateway: admission, routing and token streaming (the cluster issue)."""

"""The model runtime, knows nothing of Redis or gRPC, in packages by what each process needs:
`text` (the gateway), `kv_files` (the kvstore), and for the worker the rest (ARCHITECTURE.md).
Importing it does nothing else: a process that computes sets its threads (thread_env.py)."""

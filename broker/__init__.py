"""Redis protocol shared by gateway, worker and kvstore (the cluster issue)."""

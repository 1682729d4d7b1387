"""kvstore service: residency index and eviction decisions (the kvstore issue)."""

"""The worker's KV memory: the paged pool of blocks, who holds which block, and the idle
sessions kept in it."""

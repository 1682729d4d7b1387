"""The KV file formats, all the kvstore needs of the engine: spill files (a session) and
block files (a shared block), both framed the same way and named by the blocks' chain hash."""

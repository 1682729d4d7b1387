"""One module per CLI subcommand."""

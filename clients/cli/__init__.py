"""The `pipetune` command line."""

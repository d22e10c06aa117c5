"""The `metaq` command line: argument parsing and output only; the work is in broker and client."""

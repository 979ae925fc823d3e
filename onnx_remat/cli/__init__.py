"""The command line: `onnx-remat` (entry: signals and exit codes), its shared argument groups, and one module per
subcommand in `commands`. The top of the import graph: nothing in the package imports it."""

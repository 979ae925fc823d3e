"""Subcommands of the onnx-remat CLI, one module each, registered in onnx_remat.cli.main.COMMANDS."""

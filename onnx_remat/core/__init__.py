"""The plain-data core every layer shares: the problem and schedule the solver works on, budgets, devices, the
node-tag schema, options, errors and atomic file writes. It imports nothing from the rest of onnx_remat."""

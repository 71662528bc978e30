"""Read planning: epoch order (`order`, `bijection`), batch layout (`layout`), the plan that ties
them to a source (`planner`), and the setup I/O that surveys it (`survey`, `filter_scan`).

Modules are imported by their own names: importing this package imports nothing, so the
filter-scan child process (`lance_lightning.plan.filter_scan`) does not import torch.
"""

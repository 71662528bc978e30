"""Read planning: epoch order (`order`, `bijection`), batch layout (`layout`), the plan that ties
them to a source (`planner`), and the setup I/O that surveys it (`survey`, `filter_scan`). Every
plan is built by one function, `split.plan_split`, and read through the contract of `contract`.

Modules are imported by their own names: importing this package imports nothing, so the
filter-scan child process (`lance_lightning.plan.filter_scan`) does not import torch.
"""

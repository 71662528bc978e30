"""The device stage: what happens to a batch between the host and the training step.

Guarantees: every step of a batch's way onto the accelerator is in this folder: the non-blocking
copy (`transfer`), the one path per loader, decided when the loader is built, with its batches
prepared ahead on a side stream or in the hooks (`ahead`), the bad-row policy for the device
transform (`guard`) and the data module's device stage that decides the path and does the hooks'
work (`hooks`). Importing the folder imports nothing: a DataLoader worker that needs none of it never
loads Lightning.
"""

"""``python -m lance_lightning.cli``: the ``lance-lightning`` command."""

from lance_lightning.cli.main import main

main()

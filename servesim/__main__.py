"""``python -m servesim`` is the ``servesim`` command."""

from servesim.cli import main

main()

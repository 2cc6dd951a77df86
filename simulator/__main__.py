"""``python -m simulator`` is the ``servesim`` command."""

from simulator.cli import main

main()

"""The search loop's stores: the message board (board.py), where agents post candidates and workers
claim them and post results, and the champion registry (registry.py), which keeps the fastest verified
kernel per op signature, shape bucket, chip and toolchain. commands.py is their command line."""

"""What a plan costs: the roofline floor and calibrated prediction per kernel (model.py), and the
parallelism choice they price (parallel.py)."""

"""What polymorph knows of a chip: its `Target`, its profile (vendor figures and measured calibration)
and the microbenchmark rows that calibrate it."""

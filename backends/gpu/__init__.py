"""What the cuda and rocm backends share: one Triton lowering onto kernels/triton/, ahead-of-time
compilation to device code with a resource report, and a torch-based runtime with graph capture."""

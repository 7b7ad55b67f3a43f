"""From a graph to device code: the backend contract and registry, the kernel library, lowering onto it,
the plan, and the compile stages in their order."""

"""The run engine: pacer, latest-frame queue, one driver per workload shape, and the runner
that stacks them with the sampler, the store writer and the observers."""

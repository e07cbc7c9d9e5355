"""The training loop and its stages: experience assembly, the policy update (the only
``backward()``), runtimes per device, torchrun worlds, callbacks, SFT and evaluation."""

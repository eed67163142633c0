"""Where the check runs: CUDA simulated with fake tensors or real values tagged as CUDA, or a real GPU;
the simulated torch.cuda API; the one reading of a placement call; torch's private names (compat).
"""

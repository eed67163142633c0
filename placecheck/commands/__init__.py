"""What the CLI's commands call: audit() (api), many models in processes (runner, worker, ci). The
pytest plugin stays at the top: its module name is public.
"""

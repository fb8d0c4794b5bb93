"""The probe that ``distify verify`` puts first on the PYTHONPATH of its runs (see sitecustomize.py)."""

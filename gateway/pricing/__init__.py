"""Model prices beyond the policy's: the maintained price catalogue (``catalogue.py``)."""

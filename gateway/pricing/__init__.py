"""Model prices beyond the policy's: the maintained price catalogue (``catalogue.py``).

It stands below the routing policy, which asks it for the price of each model it leaves
unpriced, and imports nothing of the gateway but ``money``.
"""

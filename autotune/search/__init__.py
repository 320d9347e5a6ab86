"""The search, in the parent: the Tuner drives an Optuna study (tuner.py) from the baseline and the seeds
(seeds.py, warmstart.py) through the sampler's points (samplers.py), each trial between its ask and its tell
(in_flight.py, pruning.py, reattach.py) within a planned budget (budget.py) that keeps room for confirmation
(room.py); the leaders are re-measured (confirmation.py, pooling.py) and the winner chosen (candidates.py).
How is the winner chosen? candidates.pick_winner, on what confirmation measured."""

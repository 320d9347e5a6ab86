"""Where studies live, and how several runs share one: the storage URL opened as Optuna's storage, its password
hidden and its driver named (urls.py); trials asked and told with heartbeats or leases, and a dead run's trial
failed and queued again (studies.py)."""

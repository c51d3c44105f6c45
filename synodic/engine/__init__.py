"""Engine: scheduler, model runner, sampler, byte ledger and the decode loop."""

"""What a pipeline that ends by registering refuses before its first stage, on every path that starts one.

Each of these would otherwise fail only after ingest … train had run (minutes to hours on a GPU recipe):

    check                                                    why it would fail late
    a suite this environment cannot score (lm-eval missing)  the evaluate stage imports it
    a seed-spread record another recipe or config measured   the evaluate stage reads it (register.promotion
                                                             .seed_spread; packtrain.evaluate.seed_spread)
    a LoRA run without train.adapter.save_merged             the register stage has no merged model to log
    (with the power check) a suite that cannot decide        strict: refused; warn: one line per suite

    path                                              where           `here`
    packtrain run (every runner), the scheduled      run_local /      True: the stages run on this machine, so the
      retrain's local mode                           its first task   packages and the record must be here, and
                                                                      the power lines are printed
    packtrain pipeline compile | submit, the         commands/        False: the cluster's images score the suites
      scheduled retrain's cluster mode               retrain          and read the record; a record readable here
                                                                      is checked all the same, one missing here
                                                                      is the cluster's to read

All raise ConfigError (exit 2) naming the setting; none reads the training data or imports torch (the power
check counts the eval suites' items).
"""

from __future__ import annotations


def refuse_before_stages(cfg, *, here: bool) -> None:
    """The checks of the module doc for RunConfig `cfg`, in its order; `here`: the stages run on this machine."""
    from packtrain.registry.adapter import check_registrable

    if here:
        from packtrain.config.preflight import check_suite_packages
        from packtrain.evaluate.power import check_power

        check_suite_packages(cfg.evaluate)
        check_power(cfg)   # reads the seed-spread record whatever power_check says
    else:
        from packtrain.errors import MissingDataError
        from packtrain.evaluate.seed_spread import resolve_seed_spread

        try:
            resolve_seed_spread(cfg)
        except MissingDataError:
            pass
    check_registrable(cfg)

"""packtrain.model.saving: accelerate's unwrap asks for deepspeed only once it is imported (module doc)."""

from __future__ import annotations

import sys

from packtrain.model.saving import no_deepspeed_probe


def test_no_deepspeed_probe_answers_from_sys_modules_and_puts_the_probe_back():
    import accelerate.utils.other as other

    probe = other.is_deepspeed_available
    with no_deepspeed_probe():
        assert other.is_deepspeed_available() is ("deepspeed" in sys.modules)
        with no_deepspeed_probe():   # nested (a save inside a log_model)
            assert other.is_deepspeed_available() is ("deepspeed" in sys.modules)
    assert other.is_deepspeed_available is probe

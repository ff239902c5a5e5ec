"""packtrain's benchmark suites (`python -m bench --list`) and their recorded results (bench/results/)."""

"""Call graphs over the packtrain stages: the KFP pipeline (kfp_pipeline.py), the Airflow DAG
(airflow_dag.py). No logic here: the work is in the `packtrain` library."""

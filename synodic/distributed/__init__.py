"""Ray: one place that starts or joins a Ray instance (`cluster`), and the data-parallel decode replicas
behind `runtime=ray` (`replicas`)."""

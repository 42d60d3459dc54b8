"""The scheduler report: workloads, side-by-side runs of every static chain against the adaptive scheduler, chart."""

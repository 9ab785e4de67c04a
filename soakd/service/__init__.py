"""Running soakd as a service: ``serve()`` (sd_notify, Prometheus, signals) and the signal
handling it installs."""

"""What the tests share: running the suite's commands, small data sets in the real formats, tiny models and files in
the official release layouts, independent reference models, and comparing or interrupting training runs."""

"""Reports of a run: run_table.py, the fixed-width text table for task logs and the CLI;
run_page.py, the run's HTML page (cells, states, failed checks, links to logs and Data
Docs). Both read what the results store holds; neither writes to it."""

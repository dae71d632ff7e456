-- The results database as accelmatrix c367b2a left it (before Alembic): its schema.py's
-- metadata.create_all on SQLite plus one row per table, dumped with sqlite3's iterdump().
-- tests/test_results_migrations.py opens it with today's store.
BEGIN TRANSACTION;
CREATE TABLE alerts (
	dag_id VARCHAR(250) NOT NULL,
	cell_id VARCHAR(1024) NOT NULL,
	status VARCHAR(250) NOT NULL,
	kind VARCHAR(250) NOT NULL,
	recurrences INTEGER NOT NULL,
	opened_at DATETIME NOT NULL,
	last_seen_at DATETIME NOT NULL,
	resolved_at DATETIME,
	first_run_id VARCHAR(250) NOT NULL,
	last_run_id VARCHAR(250) NOT NULL,
	last_state VARCHAR(250),
	message TEXT NOT NULL,
	updated_at DATETIME NOT NULL,
	CONSTRAINT pk_alerts PRIMARY KEY (dag_id, cell_id)
);
INSERT INTO "alerts" VALUES('nightly_perf','model=tiny-wide','open','failure',2,'2026-03-01 02:00:00.000000','2026-03-01 02:00:00.000000',NULL,'scheduled__2026-02-28','scheduled__2026-03-01','run_failed','workload exited with 3','2026-03-01 02:00:00.000000');
CREATE TABLE cells (
	dag_id VARCHAR(250) NOT NULL,
	run_id VARCHAR(250) NOT NULL,
	cell_id VARCHAR(1024) NOT NULL,
	cell_index INTEGER,
	axes TEXT NOT NULL,
	machine VARCHAR(250),
	backend VARCHAR(250),
	quarantined BOOLEAN NOT NULL,
	excluded_reason TEXT,
	state VARCHAR(250) NOT NULL,
	message TEXT NOT NULL,
	attempt INTEGER NOT NULL,
	exit_code INTEGER,
	provision_started_at DATETIME,
	provisioned_at DATETIME,
	run_started_at DATETIME,
	run_ended_at DATETIME,
	teardown_at DATETIME,
	resource_held_seconds FLOAT,
	workload_seconds FLOAT,
	cost FLOAT,
	data_docs TEXT,
	updated_at DATETIME NOT NULL,
	CONSTRAINT pk_cells PRIMARY KEY (dag_id, run_id, cell_id)
);
INSERT INTO "cells" VALUES('nightly_perf','scheduled__2026-03-01','model=tiny-mlp',0,'{"model": "tiny-mlp"}','cpu-small','local',0,NULL,'passed','',1,0,NULL,NULL,NULL,NULL,NULL,12.5,10.25,0.0012,NULL,'2026-03-01 02:00:00.000000');
INSERT INTO "cells" VALUES('nightly_perf','scheduled__2026-03-01','model=tiny-wide',1,'{"model": "tiny-wide"}','cpu-small','local',0,NULL,'run_failed','workload exited with 3',1,3,NULL,NULL,NULL,NULL,NULL,12.5,10.25,0.0012,NULL,'2026-03-01 02:00:00.000000');
CREATE TABLE checks (
	dag_id VARCHAR(250) NOT NULL,
	run_id VARCHAR(250) NOT NULL,
	cell_id VARCHAR(1024) NOT NULL,
	check_name VARCHAR(250) NOT NULL,
	check_type VARCHAR(250) NOT NULL,
	passed BOOLEAN NOT NULL,
	expected TEXT,
	observed TEXT,
	message TEXT,
	benchmark VARCHAR(250),
	metric VARCHAR(250),
	value FLOAT,
	lower_bound FLOAT,
	upper_bound FLOAT,
	CONSTRAINT pk_checks PRIMARY KEY (dag_id, run_id, cell_id, check_name)
);
INSERT INTO "checks" VALUES('nightly_perf','scheduled__2026-03-01','model=tiny-mlp','step_time_within_bounds','step_time_within_bounds',1,'[0.9, 1.1]','1.0',NULL,'tiny-mlp','step_time',1.0,0.9,1.1);
CREATE TABLE metrics (
	dag_id VARCHAR(250) NOT NULL,
	run_id VARCHAR(250) NOT NULL,
	cell_id VARCHAR(1024) NOT NULL,
	name VARCHAR(250) NOT NULL,
	step INTEGER NOT NULL,
	value FLOAT,
	unit VARCHAR(250),
	source VARCHAR(250),
	CONSTRAINT pk_metrics PRIMARY KEY (dag_id, run_id, cell_id, name, step)
);
INSERT INTO "metrics" VALUES('nightly_perf','scheduled__2026-03-01','model=tiny-mlp','loss',0,1.0,NULL,'jsonl');
INSERT INTO "metrics" VALUES('nightly_perf','scheduled__2026-03-01','model=tiny-mlp','loss',1,0.5,NULL,'jsonl');
INSERT INTO "metrics" VALUES('nightly_perf','scheduled__2026-03-01','model=tiny-mlp','loss',2,3.33333333333333314829e-01,NULL,'jsonl');
INSERT INTO "metrics" VALUES('nightly_perf','scheduled__2026-03-01','model=tiny-mlp','step_time',-1,NULL,'s','profiler');
CREATE TABLE reaped (
	id INTEGER NOT NULL,
	backend VARCHAR(250) NOT NULL,
	name TEXT NOT NULL,
	labels TEXT NOT NULL,
	dag_id VARCHAR(250),
	run_id VARCHAR(250),
	cell_id VARCHAR(1024),
	reason TEXT NOT NULL,
	dry_run BOOLEAN NOT NULL,
	error TEXT,
	at DATETIME NOT NULL,
	PRIMARY KEY (id)
);
INSERT INTO "reaped" VALUES(1,'tpu-vm','am-abc','{"accelmatrix-dag": "nightly_perf"}','nightly_perf','scheduled__2026-03-01','model=tiny-wide','owner finished',0,NULL,'2026-03-01 02:00:00.000000');
CREATE TABLE runs (
	dag_id VARCHAR(250) NOT NULL,
	run_id VARCHAR(250) NOT NULL,
	suite VARCHAR(250),
	logical_date DATETIME,
	run_type VARCHAR(250),
	params TEXT NOT NULL,
	git_ref VARCHAR(250),
	runtime_version VARCHAR(250),
	state VARCHAR(250),
	started_at DATETIME,
	finished_at DATETIME,
	created_at DATETIME NOT NULL,
	updated_at DATETIME NOT NULL,
	CONSTRAINT pk_runs PRIMARY KEY (dag_id, run_id)
);
INSERT INTO "runs" VALUES('nightly_perf','scheduled__2026-03-01','nightly_perf','2026-03-01 02:00:00.000000','scheduled','{"steps": 20}','abc123','nightly-2026-03-01','failed','2026-03-01 02:00:00.000000','2026-03-01 02:00:00.000000','2026-03-01 02:00:00.000000','2026-03-01 02:00:00.000000');
CREATE TABLE series_status (
	dag_id VARCHAR(250) NOT NULL,
	benchmark VARCHAR(250) NOT NULL,
	cell_id VARCHAR(1024) NOT NULL,
	metric VARCHAR(250) NOT NULL,
	status VARCHAR(250) NOT NULL,
	points INTEGER NOT NULL,
	flips INTEGER NOT NULL,
	trailing INTEGER NOT NULL,
	longest_earlier INTEGER NOT NULL,
	last_value FLOAT,
	last_logical_date DATETIME,
	window_days INTEGER NOT NULL,
	computed_at DATETIME NOT NULL,
	CONSTRAINT pk_series_status PRIMARY KEY (dag_id, benchmark, cell_id, metric)
);
INSERT INTO "series_status" VALUES('nightly_perf','tiny-mlp','model=tiny-mlp','step_time','ok',5,0,0,0,1.0,'2026-03-01 02:00:00.000000',30,'2026-03-01 02:00:00.000000');
CREATE INDEX ix_runs_suite_logical_date ON runs (suite, logical_date);
CREATE INDEX ix_metrics_dag_name ON metrics (dag_id, name);
CREATE INDEX ix_checks_benchmark ON checks (benchmark);
CREATE INDEX ix_reaped_at ON reaped (at);
COMMIT;

-- Looker-Studio-ready views over the accelmatrix warehouse (docs/results-schema.md,
-- "BigQuery tables"). `python -m accelmatrix export` creates them with `{dataset}` replaced
-- by PROJECT.DATASET; run this file by hand the same way (bq query --use_legacy_sql=false).
--
-- cell_nights: one row per suite, cell and night (run_date): the verdict of the night's
-- latest suite run (a re-run of the night replaces an earlier one; pull-request and
-- follow-up runs are left out), the build, and the tracked metrics: the values the perf
-- checks judged, with their bounds, as one display string and one column per verdict count.
CREATE OR REPLACE VIEW `{dataset}.cell_nights` AS
WITH latest AS (
  SELECT c.*, r.runtime_version AS build, r.state AS run_state, r.finished_at
  FROM `{dataset}.cells` AS c
  JOIN `{dataset}.runs` AS r USING (suite, run_id)
  WHERE r.run_kind = 'default'
  QUALIFY ROW_NUMBER() OVER (
    PARTITION BY c.suite, c.cell_id, c.run_date ORDER BY r.finished_at DESC, c.run_id DESC
  ) = 1
),
tracked AS (
  SELECT
    suite, run_id, cell_id,
    COUNTIF(benchmark IS NOT NULL) AS perf_checks,
    COUNTIF(benchmark IS NOT NULL AND NOT passed) AS perf_failed,
    COUNTIF(NOT passed) AS checks_failed,
    STRING_AGG(
      IF(benchmark IS NULL, NULL,
         CONCAT(metric, '=', CAST(value AS STRING),
                ' [', CAST(lower_bound AS STRING), ', ', CAST(upper_bound AS STRING), ']')),
      '; ' ORDER BY metric
    ) AS tracked_metrics
  FROM `{dataset}.check_verdicts`
  GROUP BY suite, run_id, cell_id
)
SELECT
  l.suite,
  l.run_date AS night,
  l.cell_id,
  l.machine,
  l.backend,
  l.build,
  l.run_id,
  l.state AS verdict,
  l.passed,
  l.quarantined,
  l.run_state,
  l.workload_seconds,
  l.cost,
  IFNULL(t.perf_checks, 0) AS perf_checks,
  IFNULL(t.perf_failed, 0) AS perf_failed,
  IFNULL(t.checks_failed, 0) AS checks_failed,
  t.tracked_metrics
FROM latest AS l
LEFT JOIN tracked AS t USING (suite, run_id, cell_id);

-- cell_night_metrics: the same nights, one row per tracked metric, for charts (a series per
-- suite, cell and metric, with its bounds).
CREATE OR REPLACE VIEW `{dataset}.cell_night_metrics` AS
SELECT
  n.suite, n.night, n.cell_id, n.machine, n.build, n.run_id, n.verdict,
  v.benchmark, v.metric, v.value, v.lower_bound, v.upper_bound, v.passed AS within_bounds
FROM `{dataset}.cell_nights` AS n
JOIN `{dataset}.check_verdicts` AS v USING (suite, run_id, cell_id)
WHERE v.benchmark IS NOT NULL;

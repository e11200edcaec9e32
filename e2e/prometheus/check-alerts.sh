#!/usr/bin/env bash
# Checks the alert rules with promtool, built from its Go module by build.sh (cached):
#   promtool check rules charts/eddy-operator/files/alerts.yaml
#   promtool test rules  e2e/prometheus/alerts_test.yaml         (unit tests: every alert)
# and the chart's PrometheusRule as `helm template` renders it with the default values: the
# same checks and the same unit tests on its rules. e2e/tests/alerts.rs checks that rendering
# equals the plain file and follows the chart values.
#
#   check-alerts.sh [HELM]     HELM: a helm binary (default: the one e2e/k8s/cluster.sh builds)
set -euo pipefail
cd "$(dirname "$0")/../.."

promtool="$(e2e/prometheus/build.sh | tail -n 1)/promtool"
helm="${1:-$(e2e/k8s/cluster.sh bin | tail -n 1)/helm}"
rules=charts/eddy-operator/files/alerts.yaml
tests=e2e/prometheus/alerts_test.yaml

"$promtool" check rules "$rules"
"$promtool" test rules "$tests"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# The PrometheusRule's spec is the rules file: drop everything up to `spec:` and its indent.
"$helm" template t charts/eddy-operator --set alerts.force=true \
  --show-only templates/prometheusrule.yaml >"$tmp/prometheusrule.yaml"
sed -e '1,/^spec:$/d' -e 's/^  //' "$tmp/prometheusrule.yaml" >"$tmp/rendered.yaml"
grep -q '^groups:$' "$tmp/rendered.yaml" || {
  echo "check-alerts.sh: no groups in the rendered PrometheusRule:" >&2
  cat "$tmp/prometheusrule.yaml" >&2
  exit 1
}
"$promtool" check rules "$tmp/rendered.yaml"
sed "s#^  - ../../$rules\$#  - rendered.yaml#; s#^- ../../$rules\$#- rendered.yaml#" "$tests" >"$tmp/alerts_test.yaml"
grep -q 'rendered.yaml' "$tmp/alerts_test.yaml" || {
  echo "check-alerts.sh: $tests does not name ../../$rules in rule_files" >&2
  exit 1
}
"$promtool" test rules "$tmp/alerts_test.yaml"
echo "alert rules: promtool check and unit tests pass, for the plain file and the chart's PrometheusRule" >&2

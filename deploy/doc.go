// Package deploy holds shardgate's deployment artifacts: container image scripts (images/), the
// compose sandbox (compose/), Kubernetes manifests (k8s/), Prometheus rules (prometheus/) and
// the Grafana dashboard (grafana/). It has no code; its tests check that the artifacts agree
// with the router: manifests parse, configuration files load with the router's own parsers,
// and every dashboard query names a metric the router exports.
package deploy

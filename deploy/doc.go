// Package deploy holds no code: its tests check the deploy files beside it
// offline. The compose test checks that every FLO_* variable
// compose/docker-compose.yaml gives a service is one that service's config
// reads, with a value it parses, and that the services are wired to each
// other. The Kubernetes test builds every kustomize overlay under k8s/,
// decodes each object strictly with the Kubernetes API types and checks the
// invariants a rollout relies on (probes, non-root, graceful termination,
// an autoscaler and a disruption budget per Deployment, migration Jobs) and
// what the NetworkPolicies admit: every pod isolated, each internal
// service's gRPC port reached only by the gateway and the services that dial
// it, the in-namespace Postgres and Kafka only by Flo pods.
package deploy

package deploy_test

import (
	"fmt"
	"os"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
)

// generatedSuffix is the content hash kustomize appends to a generated
// Secret's name.
var generatedSuffix = regexp.MustCompile(`-[a-z0-9]{10}$`)

// secretVars maps each variable of c that comes from a Secret to "name/key",
// the name without a generator's hash.
func secretVars(c corev1.Container) map[string]string {
	out := map[string]string{}
	for _, e := range c.Env {
		if ref := e.ValueFrom; ref != nil && ref.SecretKeyRef != nil {
			out[e.Name] = generatedSuffix.ReplaceAllString(ref.SecretKeyRef.Name, "") + "/" + ref.SecretKeyRef.Key
		}
	}
	return out
}

// mountedFromSecret reports whether file lies in a volume of spec's only
// container that a Secret fills.
func mountedFromSecret(spec corev1.PodSpec, file string) bool {
	secrets := map[string]bool{}
	for _, v := range spec.Volumes {
		if v.Secret != nil {
			secrets[v.Name] = true
		}
	}
	for _, m := range spec.Containers[0].VolumeMounts {
		if secrets[m.Name] && path.Dir(file) == path.Clean(m.MountPath) {
			return true
		}
	}
	return false
}

// TestKubernetesCredentialsComeFromSecrets: every Deployment takes the
// internal token from a Secret and the gateway its admin key; the gateway's
// metrics port is the one it serves. In production every connection is
// secured: Kafka over TLS with SASL credentials from a Secret, internal mTLS
// files and the gateway's certificate mounted from Secrets, Postgres verified
// against its CA (sslmode=verify-full).
func TestKubernetesCredentialsComeFromSecrets(t *testing.T) {
	t.Parallel()
	eachOverlay(t, func(t *testing.T, b k8sBuild) {
		for _, flo := range sortedKeys(b.deployments) {
			spec := b.deployments[flo].Spec.Template.Spec
			what := fmt.Sprintf("%s: %s", b.dir, flo)
			fromSecret := secretVars(spec.Containers[0])
			require.Equal(t, "flo-auth/internal-token", fromSecret["FLO_INTERNAL_TOKEN"], what)
			if flo == "gateway" {
				require.Equal(t, "flo-auth/admin-token", fromSecret["FLO_ADMIN_TOKEN"], what)
				cfg := b.serveConfig(t, flo)
				var metrics int32
				for _, p := range spec.Containers[0].Ports {
					if p.Name == "metrics" {
						metrics = p.ContainerPort
					}
				}
				require.Equal(t, port(t, stringField(cfg, "MetricsAddr")), fmt.Sprint(metrics), "%s: metrics containerPort", what)
			}
			if b.dir != "k8s/overlays/production" {
				continue
			}
			values, _ := b.containerEnv(t, what, spec.Containers[0])
			require.Equal(t, "true", values["FLO_KAFKA_TLS"], what)
			require.True(t, strings.HasPrefix(values["FLO_KAFKA_SASL_MECHANISM"], "SCRAM-"), "%s: SASL/SCRAM", what)
			require.Contains(t, fromSecret, "FLO_KAFKA_SASL_USER", what)
			require.Contains(t, fromSecret, "FLO_KAFKA_SASL_PASSWORD", what)
			files := []string{"FLO_KAFKA_TLS_CA", "FLO_INTERNAL_TLS_CERT", "FLO_INTERNAL_TLS_KEY", "FLO_INTERNAL_TLS_CA"}
			if flo == "gateway" {
				files = append(files, "FLO_GATEWAY_TLS_CERT", "FLO_GATEWAY_TLS_KEY")
			}
			for _, name := range files {
				require.True(t, mountedFromSecret(spec, values[name]), "%s: %s=%q is not a file mounted from a Secret", what, name, values[name])
			}
		}
		if b.dir != "k8s/overlays/production" {
			return
		}
		// The flo-postgres URL says sslmode=verify-full&sslrootcert=postgresCA:
		// every pod that connects has the file.
		for _, flo := range sortedKeys(b.deployments) {
			if floServices[flo].schema {
				require.True(t, mountedFromSecret(b.deployments[flo].Spec.Template.Spec, postgresCA), "%s: %s has no Postgres CA", b.dir, flo)
			}
		}
		for _, name := range sortedKeys(b.jobs) {
			require.True(t, mountedFromSecret(b.jobs[name].Spec.Template.Spec, postgresCA), "%s: Job %s has no Postgres CA", b.dir, name)
		}
		raw, err := os.ReadFile("k8s/overlays/production/kustomization.yaml")
		require.NoError(t, err)
		require.Contains(t, string(raw), "sslmode=verify-full&sslrootcert="+postgresCA, "the flo-postgres URL the overlay documents")
	})
}

// postgresCA is where production pods find the CA of Postgres's certificate.
const postgresCA = "/etc/flo/postgres/ca.crt"

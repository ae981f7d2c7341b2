package service_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// TestStreamsPerNamespaceLimit: creations racing for the last places of a
// namespace get exactly as many streams as the limit allows, the others
// RESOURCE_EXHAUSTED naming the setting; a deletion makes room again and
// other namespaces are not affected.
func TestStreamsPerNamespaceLimit(t *testing.T) {
	e := newEnv(t)
	cfg := e.config()
	cfg.MaxStreamsPerNamespace = 2
	c := e.start(t, cfg).client
	ns, other := namespace(), namespace()

	errs := make([]error, 5)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = c.CreateStream(t.Context(), &flov1.CreateStreamRequest{Namespace: ns, Name: fmt.Sprintf("s%d", i), Partitions: 1})
		}()
	}
	wg.Wait()
	var created []string
	for i, err := range errs {
		if err != nil {
			requireCode(t, codes.ResourceExhausted, err, "the limit is 2 (FLO_MAX_STREAMS_PER_NAMESPACE)")
			continue
		}
		created = append(created, fmt.Sprintf("s%d", i))
	}
	require.Len(t, created, 2)

	createStream(t, c, other, "s0", 1)
	createStream(t, c, other, "s1", 1)

	_, err := c.DeleteStream(t.Context(), &flov1.GetStreamRequest{Namespace: ns, Stream: created[0]})
	require.NoError(t, err)
	createStream(t, c, ns, "after-delete", 1)
	_, err = c.CreateStream(t.Context(), &flov1.CreateStreamRequest{Namespace: ns, Name: "one-too-many", Partitions: 1})
	requireCode(t, codes.ResourceExhausted, err, "namespace "+ns+" has 2 streams")
}

package owner

import (
	"context"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// member joins the dispatchers' group as a Replica would and reports the
// partitions it was assigned.
func member(t *testing.T, conn kafkaConn) (*Replica, func() []int32) {
	t.Helper()
	var (
		mu    sync.Mutex
		owned []int32
	)
	group, err := kafka.NewClient(conn.cfg, kgo.ConsumerGroup(kafka.DispatcherGroup), kgo.ConsumeTopics(kafka.CommandsTopic),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, a map[string][]int32) {
			mu.Lock()
			owned = append(owned, a[kafka.CommandsTopic]...)
			mu.Unlock()
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, r map[string][]int32) {
			mu.Lock()
			owned = slices.DeleteFunc(owned, func(p int32) bool { return slices.Contains(r[kafka.CommandsTopic], p) })
			mu.Unlock()
		}))
	require.NoError(t, err)
	t.Cleanup(group.Close)
	go func() {
		for {
			if f := group.PollFetches(t.Context()); f.IsClientClosed() || t.Context().Err() != nil {
				return
			}
		}
	}()
	return &Replica{admin: conn.admin, group: group}, func() []int32 {
		mu.Lock()
		defer mu.Unlock()
		return append([]int32(nil), owned...)
	}
}

type kafkaConn struct {
	cfg   config.Kafka
	admin *kgo.Client
}

// The group coordinator says which partitions a member owns: the check a
// replica makes before taking a partition's transactional id back after a
// failure, so a replica paused past its session does not fence the owner.
func TestStillOwnsAsksTheGroupCoordinator(t *testing.T) {
	broker := harness.NewBroker(t)
	admin, err := kafka.NewClient(broker.Kafka())
	require.NoError(t, err)
	t.Cleanup(admin.Close)
	require.NoError(t, kafka.EnsureTopics(t.Context(), admin, 2, kafka.CommandsTopic))
	conn := kafkaConn{cfg: broker.Kafka(), admin: admin}

	a, ownedByA := member(t, conn)
	b, ownedByB := member(t, conn)
	require.Eventually(t, func() bool { return len(ownedByA()) == 1 && len(ownedByB()) == 1 }, 30*time.Second, 20*time.Millisecond)
	for _, c := range []struct {
		r          *Replica
		own, other int32
	}{{a, ownedByA()[0], ownedByB()[0]}, {b, ownedByB()[0], ownedByA()[0]}} {
		owns, err := c.r.stillOwns(t.Context(), c.own)
		require.NoError(t, err)
		require.True(t, owns)
		owns, err = c.r.stillOwns(t.Context(), c.other)
		require.NoError(t, err)
		require.False(t, owns, "another member's partition")
	}
}

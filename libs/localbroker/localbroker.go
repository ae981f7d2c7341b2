// Package localbroker runs an embedded Kafka-protocol broker (franz-go's
// kfake) for `flo dev` and tests, so neither needs Redpanda.
package localbroker

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/razorbill/flo/libs/config"
)

// Broker is a single-node kfake cluster on loopback.
type Broker struct {
	dataDir    string
	partitions int32

	mu       sync.Mutex
	port     int
	cluster  *kfake.Cluster
	counting bool
	// requests counts the requests handled by API key once CountRequests
	// was called.
	requests [kmsg.MaxKey + 1]atomic.Int64
}

// Start runs a kfake cluster on 127.0.0.1:port (0 = a free port, kept across
// Restart), persisting to dataDir when non-empty, with auto topic creation and
// the given default number of partitions (kfake's default when <= 0).
func Start(port int, dataDir string, partitions int32) (*Broker, error) {
	b := &Broker{dataDir: dataDir, partitions: partitions, port: port}
	if err := b.start(); err != nil {
		return nil, err
	}
	return b, nil
}

func (b *Broker) start() error {
	opts := []kfake.Opt{
		kfake.Ports(b.port),
		kfake.AllowAutoTopicCreation(),
	}
	if b.partitions > 0 {
		opts = append(opts, kfake.DefaultNumPartitions(int(b.partitions)))
	}
	if b.dataDir != "" {
		opts = append(opts, kfake.DataDir(b.dataDir))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return fmt.Errorf("start kafka broker on port %d: %w", b.port, err)
	}
	addrs := c.ListenAddrs()
	if len(addrs) != 1 {
		c.Close()
		return fmt.Errorf("start kafka broker: want one listener, got %v", addrs)
	}
	_, portText, err := net.SplitHostPort(addrs[0])
	if err == nil {
		b.port, err = strconv.Atoi(portText)
	}
	if err != nil {
		c.Close()
		return fmt.Errorf("start kafka broker: parse address %q: %w", addrs[0], err)
	}
	b.cluster = c
	if b.counting {
		b.observe()
	}
	return nil
}

// CountRequests makes the broker count the requests it handles, from now on
// and across restarts, for Requests. It is for benchmarks (flo-bench): each
// request then costs one more function call in the broker's loop.
func (b *Broker) CountRequests() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.counting {
		return
	}
	b.counting = true
	if b.cluster != nil {
		b.observe()
	}
}

// observe adds a control function that counts every request and handles
// none, so the cluster keeps it and answers each request as usual.
func (b *Broker) observe() {
	b.cluster.Control(func(req kmsg.Request) (kmsg.Response, error, bool) {
		if k := req.Key(); k >= 0 && int(k) < len(b.requests) {
			b.requests[k].Add(1)
		}
		return nil, nil, false
	})
}

// Requests returns how many requests of each kind (kmsg.NameForKey) the
// broker handled since CountRequests; kinds it never handled are left out.
func (b *Broker) Requests() map[string]int64 {
	out := map[string]int64{}
	for k := range b.requests {
		if n := b.requests[k].Load(); n > 0 {
			out[kmsg.NameForKey(int16(k))] = n
		}
	}
	return out
}

// Addrs returns the seed broker addresses.
func (b *Broker) Addrs() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port))}
}

// Restart closes the cluster and starts it again on the same port and data
// directory. With a data directory, records, topics and committed group
// offsets survive; without one, the restarted broker is empty. After Close,
// Restart starts the broker again, so tests can keep it down for a while.
func (b *Broker) Restart() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cluster != nil {
		b.cluster.Close()
		b.cluster = nil
	}
	return b.start()
}

// Close stops the broker, flushing its state to the data directory. Closing
// twice does nothing.
func (b *Broker) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cluster != nil {
		b.cluster.Close()
		b.cluster = nil
	}
}

// Kafka returns the connection settings of the broker, for libs/kafka.
func (b *Broker) Kafka() config.Kafka { return config.Kafka{Brokers: b.Addrs()} }

// Package localbroker runs an embedded Kafka-protocol broker (franz-go's
// kfake) for `flo dev` and tests, so neither needs Redpanda.
package localbroker

import (
	"fmt"
	"net"
	"strconv"
	"sync"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/razorbill/flo/libs/config"
)

// Broker is a single-node kfake cluster on loopback.
type Broker struct {
	dataDir    string
	partitions int32

	mu      sync.Mutex
	port    int
	cluster *kfake.Cluster
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
	return nil
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

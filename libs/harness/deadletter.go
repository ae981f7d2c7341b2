package harness

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/kafka"
)

// WaitDeadLetter waits until a record of topic's dead-letter topic matches
// and returns it, failing the test after 20 seconds.
func WaitDeadLetter(tb testing.TB, brokers []string, topic string, match func(*kafka.DeadLetter) bool) *kafka.DeadLetter {
	tb.Helper()
	var found *kafka.DeadLetter
	require.Eventually(tb, func() bool {
		letters, err := kafka.ReadDeadLetters(tb.Context(), config.Kafka{Brokers: brokers}, kafka.DeadLetterTopic(topic))
		if err != nil {
			return false
		}
		if i := slices.IndexFunc(letters, match); i >= 0 {
			found = letters[i]
		}
		return found != nil
	}, 20*time.Second, 10*time.Millisecond, "no record of %s was dead-lettered", topic)
	return found
}

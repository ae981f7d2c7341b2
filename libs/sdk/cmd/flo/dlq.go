package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/services/devstack"
)

// brokerTimeout bounds one dlq command's work with the broker: an operator
// command fails rather than waiting for a broker that is down.
const brokerTimeout = 30 * time.Second

// Widths of the table `flo dlq list` prints; --json prints everything whole.
const (
	previewBytes = 40
	errorRunes   = 80
)

// deadLetterView is how `flo dlq list --json` prints a dead-lettered record.
type deadLetterView struct {
	Offset          int64             `json:"offset"`
	Partition       int32             `json:"partition"`
	DeadAt          time.Time         `json:"dead_at"`
	SourceTopic     string            `json:"source_topic"`
	SourcePartition int32             `json:"source_partition"`
	SourceOffset    int64             `json:"source_offset"`
	Group           string            `json:"group"`
	Error           string            `json:"error"`
	Key             string            `json:"key"`
	Value           []byte            `json:"value"`
	Headers         map[string]string `json:"headers,omitempty"`
	Replays         []time.Time       `json:"replays,omitempty"`
}

func viewOf(dl *kafka.DeadLetter) deadLetterView {
	return deadLetterView{
		Offset: dl.Offset, Partition: dl.Partition, DeadAt: dl.Timestamp,
		SourceTopic: dl.SourceTopic, SourcePartition: dl.SourcePartition, SourceOffset: dl.SourceOffset,
		Group: dl.Group, Error: dl.Error, Key: string(dl.Key), Value: dl.Value, Headers: dl.Headers, Replays: dl.Replays,
	}
}

// brokerFlag is the --brokers flag of the dlq commands.
type brokerFlag struct{ brokers []string }

func (f *brokerFlag) register(cmd *cobra.Command) {
	cmd.Flags().StringSliceVar(&f.brokers, "brokers", nil,
		"the Kafka-protocol `brokers`, comma-separated (default: FLO_KAFKA_BROKERS, else the broker flo dev runs on FLO_DEV_BROKER_PORT)")
}

// resolve returns the broker connection of the environment (FLO_KAFKA_*,
// TLS and SASL included), with the brokers the flag names, if any.
func (f *brokerFlag) resolve(ctx context.Context) (config.Kafka, error) {
	var conn config.Kafka
	if err := config.Load(ctx, &conn); err != nil {
		return conn, fmt.Errorf("load configuration: %w", err)
	}
	if len(f.brokers) > 0 {
		conn.Brokers = f.brokers
		return conn, nil
	}
	if len(conn.Brokers) == 0 {
		var cfg devstack.Config
		if err := config.Load(ctx, &cfg); err != nil {
			return conn, fmt.Errorf("load configuration: %w", err)
		}
		conn.Brokers = []string{"localhost:" + strconv.Itoa(cfg.BrokerPort)}
	}
	return conn, nil
}

// newDeadLetterTopicsCmd reads and replays dead-letter topics directly on the broker: an
// operator's tool, next to the gateway's API rather than through it.
func newDeadLetterTopicsCmd() *cobra.Command {
	cmd := newGroupCmd("dlq", "List and replay the records consumers dead-lettered (<topic>.dlq)")
	cmd.Long = `A consumer group that cannot handle a record even on its own (it does not decode, what it says is
impossible, or the store refuses it for a reason other than a transient one) writes it to the
topic's dead-letter topic, <topic>.dlq, with headers naming the error, the source topic, partition
and offset and the group, and moves on. These commands talk to the broker directly.`

	var (
		listBrokers brokerFlag
		limit       int
		asJSON      bool
	)
	list := &cobra.Command{
		Use:   "list TOPIC.dlq",
		Short: "List a dead-letter topic's records, oldest first",
		Long: `Lists the records of a dead-letter topic, oldest first: the offset to replay it by, where it came
from, the consumer group, the error, the key, a preview of the value, and when it was replayed
if it was. --json prints every field whole (the value in base64).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if limit <= 0 {
				return errors.New("--limit must be positive")
			}
			brokers, err := listBrokers.resolve(cmd.Context())
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), brokerTimeout)
			defer cancel()
			letters, err := kafka.ReadDeadLetters(ctx, brokers, args[0])
			if err != nil {
				return err
			}
			if len(letters) > limit {
				fmt.Fprintf(cmd.ErrOrStderr(), "showing the oldest %d of %d records; raise --limit for more\n", limit, len(letters))
				letters = letters[:limit]
			}
			if asJSON {
				out := make([]deadLetterView, len(letters))
				for i, dl := range letters {
					out[i] = viewOf(dl)
				}
				return printJSON(cmd, out)
			}
			return printDeadLetters(cmd, letters)
		},
	}
	listBrokers.register(list)
	list.Flags().IntVar(&limit, "limit", 100, "at most this many")
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(list)

	var (
		replayBrokers brokerFlag
		offsets       []int64
		all, again    bool
	)
	replay := &cobra.Command{
		Use:   "replay TOPIC.dlq (--offset O ... | --all)",
		Short: "Produce dead-lettered records back into their source topic, once their cause is fixed",
		Long: `Produces the chosen records of a dead-letter topic back into their source topic (the
flo.dlq.topic header, else the name without .dlq) with their key, value and own headers, plus
flo.dlq.replayed-from naming where they were. A note in the dead-letter topic records each replay,
which list shows; a record replayed before is refused unless --again is given. Fix the cause
first, or the consumer dead-letters the record again. Consumers are idempotent, so a record whose
effect already happened changes nothing.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			brokers, err := replayBrokers.resolve(cmd.Context())
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), brokerTimeout)
			defer cancel()
			replayed, err := kafka.ReplayDeadLetters(ctx, brokers, args[0], kafka.Selection{Offsets: offsets, All: all, Again: again})
			if err != nil {
				return err
			}
			out := make([]map[string]any, len(replayed))
			for i, dl := range replayed {
				out[i] = map[string]any{"offset": dl.Offset, "topic": dl.SourceTopic, "key": string(dl.Key)}
			}
			return printJSON(cmd, map[string]any{"replayed": out})
		},
	}
	replayBrokers.register(replay)
	replay.Flags().Int64SliceVar(&offsets, "offset", nil, "the `offset` of a record to replay (repeat or comma-separate for more)")
	replay.Flags().BoolVar(&all, "all", false, "replay every record not replayed before")
	replay.Flags().BoolVar(&again, "again", false, "also replay records that were replayed before")
	replay.MarkFlagsMutuallyExclusive("offset", "all")
	replay.MarkFlagsOneRequired("offset", "all")
	cmd.AddCommand(replay)
	return cmd
}

// printDeadLetters prints letters as a table, one line each.
func printDeadLetters(cmd *cobra.Command, letters []*kafka.DeadLetter) error {
	w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "OFFSET\tSOURCE\tGROUP\tREPLAYED\tKEY\tERROR\tVALUE")
	for _, dl := range letters {
		replayed := "-"
		if n := len(dl.Replays); n > 0 {
			replayed = dl.Replays[n-1].UTC().Format(time.RFC3339)
			if n > 1 {
				replayed += fmt.Sprintf(" (%d times)", n)
			}
		}
		fmt.Fprintf(w, "%d\t%s/%d@%d\t%s\t%s\t%s\t%s\t%s\n", dl.Offset, dl.SourceTopic, dl.SourcePartition, dl.SourceOffset,
			dl.Group, replayed, preview(dl.Key), shorten(dl.Error, errorRunes), preview(dl.Value))
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	return nil
}

// preview quotes the start of b, escaping what is not printable.
func preview(b []byte) string {
	if len(b) <= previewBytes {
		return strconv.Quote(string(b))
	}
	return strconv.Quote(string(b[:previewBytes])) + "…"
}

// shorten cuts s to n runes on one line.
func shorten(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n]) + "…"
}

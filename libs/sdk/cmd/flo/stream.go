package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	flo "github.com/razorbill/flo-go"
	"github.com/spf13/cobra"
)

const (
	// appendBatchRecords and appendBatchBytes bound one Append call of a batch read from JSON
	// lines: well inside the server's 10,000 records per call and gRPC's 4 MiB messages.
	appendBatchRecords = 1000
	appendBatchBytes   = 1 << 20
	// followBlock is how long one read of `stream read --follow` waits for new records before
	// asking again.
	followBlock = 30 * time.Second
)

func newStreamCmd(g *globals) *cobra.Command {
	cmd := newGroupCmd("stream", "Create, append to, read and delete streams, and manage their consumer groups")
	cmd.AddCommand(newStreamCreateCmd(g))
	cmd.AddCommand(newStreamAppendCmd(g))
	cmd.AddCommand(newStreamReadCmd(g))
	cmd.AddCommand(&cobra.Command{
		Use:   "info NAME",
		Short: "Show a stream with its length, first and last ids and consumer groups",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(func(c *flo.Client) error {
				info, err := c.GetStream(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return printJSON(cmd, info)
			})
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List the namespace's streams",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withClient(func(c *flo.Client) error {
				list, err := c.ListStreams(cmd.Context())
				if err != nil {
					return err
				}
				return printJSON(cmd, list)
			})
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a stream with its records and consumer groups",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(func(c *flo.Client) error {
				if err := c.DeleteStream(cmd.Context(), args[0]); err != nil {
					return err
				}
				return printJSON(cmd, map[string]string{"stream": args[0], "status": "deleted"})
			})
		},
	})
	cmd.AddCommand(newStreamGroupCmd(g))
	return cmd
}

func newStreamCreateCmd(g *globals) *cobra.Command {
	var opts flo.StreamOptions
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a stream",
		Long: "Create a stream. Unset flags take the server's defaults: one partition, records kept forever.\n" +
			"Records with the same --key (see append) share a partition and keep their order there.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if opts.Partitions < 0 || opts.Retention < 0 || opts.RetentionBytes < 0 {
				return errors.New("--partitions, --retention and --retention-bytes must not be negative")
			}
			return g.withClient(func(c *flo.Client) error {
				s, err := c.CreateStream(cmd.Context(), args[0], opts)
				if err != nil {
					return err
				}
				return printJSON(cmd, s)
			})
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.Partitions, "partitions", 0, "number of partitions, 1 to 256 (default 1)")
	f.DurationVar(&opts.Retention, "retention", 0, "how long records are kept, e.g. 24h; at least 1m (default: forever)")
	f.Int64Var(&opts.RetentionBytes, "retention-bytes", 0, "most bytes kept per partition, oldest records going first; at least 1048576 (default: no limit)")
	return cmd
}

func newStreamAppendCmd(g *globals) *cobra.Command {
	var (
		key     string
		headers []string
		file    string
	)
	cmd := &cobra.Command{
		Use:   "append NAME {'JSON' | - | --file FILE}",
		Short: "Append a record and print its id, or a batch of JSON lines and print their ids",
		Long: "Append the JSON argument as one record and print its id. With - (standard input) or --file,\n" +
			"every non-empty line is a JSON record; the lines are checked first, then appended in\n" +
			"batches of up to 1000, and the ids are printed in line order. --key and --header apply to\n" +
			"every record.",
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var opts []flo.AppendOption
			if key != "" {
				opts = append(opts, flo.WithKey(key))
			}
			if len(headers) > 0 {
				h, err := parseHeaders(headers)
				if err != nil {
					return err
				}
				opts = append(opts, flo.WithHeaders(h))
			}
			switch {
			case len(args) == 2 && file != "":
				return errors.New("give the record as an argument or --file, not both")
			case len(args) == 1 && file == "":
				return errors.New("give the record as a JSON argument, - for JSON lines on standard input, or --file")
			case len(args) == 2 && args[1] != "-":
				payload, err := parsePayload(args[1])
				if err != nil {
					return err
				}
				return g.withClient(func(c *flo.Client) error {
					id, err := c.Append(cmd.Context(), args[0], payload, opts...)
					if err != nil {
						return err
					}
					return printJSON(cmd, map[string]string{"id": id})
				})
			}
			in := cmd.InOrStdin()
			if file != "" && file != "-" {
				f, err := os.Open(file)
				if err != nil {
					return fmt.Errorf("read records: %w", err)
				}
				defer f.Close()
				in = f
			}
			payloads, err := readJSONLines(in)
			if err != nil {
				return err
			}
			return g.withClient(func(c *flo.Client) error {
				ids := make([]string, 0, len(payloads))
				for _, batch := range appendBatches(payloads) {
					got, err := c.AppendMany(cmd.Context(), args[0], batch, opts...)
					if err != nil {
						if len(ids) > 0 {
							return fmt.Errorf("%w (the first %d records were appended)", err, len(ids))
						}
						return err
					}
					ids = append(ids, got...)
				}
				return printJSON(cmd, map[string][]string{"ids": ids})
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&key, "key", "", "partition key: records with the same key keep their order")
	f.StringArrayVar(&headers, "header", nil, "a header key=value; repeat for more")
	f.StringVarP(&file, "file", "f", "", "append every line of FILE (- for standard input) as a JSON record")
	return cmd
}

// parseHeaders turns key=value flags into a map.
func parseHeaders(flags []string) (map[string]string, error) {
	h := make(map[string]string, len(flags))
	for _, kv := range flags {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--header %q: want key=value", kv)
		}
		h[k] = v
	}
	return h, nil
}

// readJSONLines reads every non-empty line of in as a JSON record, checking them all before
// anything is appended, so a bad line costs nothing.
func readJSONLines(in io.Reader) ([]json.RawMessage, error) {
	var payloads []json.RawMessage
	sc := bufio.NewScanner(in)
	// A record may be as large as the server allows (1 MiB by default), and then some.
	sc.Buffer(make([]byte, 0, 64<<10), 8<<20)
	for line := 1; sc.Scan(); line++ {
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		if !json.Valid(text) {
			var v any
			err := json.Unmarshal(text, &v)
			return nil, fmt.Errorf("line %d: invalid JSON: %w", line, err)
		}
		payloads = append(payloads, json.RawMessage(bytes.Clone(text)))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read records: %w", err)
	}
	if len(payloads) == 0 {
		return nil, errors.New("no records to append: the input has no JSON lines")
	}
	return payloads, nil
}

// appendBatches splits payloads into calls of at most appendBatchRecords records and about
// appendBatchBytes bytes.
func appendBatches(payloads []json.RawMessage) [][]any {
	var batches [][]any
	var batch []any
	size := 0
	for _, p := range payloads {
		if len(batch) > 0 && (len(batch) == appendBatchRecords || size+len(p) > appendBatchBytes) {
			batches = append(batches, batch)
			batch, size = nil, 0
		}
		batch = append(batch, p)
		size += len(p)
	}
	return append(batches, batch)
}

func newStreamReadCmd(g *globals) *cobra.Command {
	var (
		opts   flo.ReadOptions
		follow bool
	)
	cmd := &cobra.Command{
		Use:   "read NAME",
		Short: "Read records by id range or from the tail",
		Long: "Read records of a stream and print them with the start to read on from (next).\n" +
			"--start takes an id, - for the first record, (ID for the records after ID, $ for records\n" +
			"appended from now on, or the next of an earlier read to read on where it ended; --tail N\n" +
			"reads the last N records instead of a range.\n" +
			"--follow prints the selected records, then every record appended after them, one JSON\n" +
			"object per line, until interrupted.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if opts.Count < 0 || opts.Tail < 0 || opts.Block < 0 {
				return errors.New("--count, --tail and --block must not be negative")
			}
			if opts.Tail > 0 && (opts.Start != "" || opts.End != "") {
				return errors.New("--tail reads the last records; it cannot be combined with --start or --end")
			}
			if follow && opts.End != "" {
				return errors.New("--follow reads on as records are appended; it cannot be combined with --end")
			}
			return g.withClient(func(c *flo.Client) error {
				if follow {
					return followStream(cmd, c, args[0], opts)
				}
				records, next, err := c.Read(cmd.Context(), args[0], opts)
				if err != nil {
					return err
				}
				return printJSON(cmd, struct {
					Records []*flo.Record `json:"records"`
					Next    string        `json:"next,omitempty"`
				}{records, next})
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Start, "start", "", "where to start: an id, - (first record), (ID (after ID), $ (new records) or an earlier read's next")
	f.StringVar(&opts.End, "end", "", "last id to read, inclusive (default: the last record)")
	f.IntVar(&opts.Count, "count", 0, "most records per read, at most 10000 (default 100)")
	f.IntVar(&opts.Tail, "tail", 0, "read the last N records instead of a range")
	f.DurationVar(&opts.Block, "block", 0, "how long to wait for a record when none is there yet (default with --follow: 30s)")
	f.BoolVar(&follow, "follow", false, "keep reading records as they are appended, one JSON object per line")
	return cmd
}

// followStream prints the records opts select, then the records appended after them, until
// the command's context ends (ctrl-C), which is not an error.
func followStream(cmd *cobra.Command, c *flo.Client, stream string, opts flo.ReadOptions) error {
	ctx := cmd.Context()
	enc := json.NewEncoder(cmd.OutOrStdout())
	block := opts.Block
	if block == 0 {
		block = followBlock
	}
	if opts.Start == "" && opts.Tail == 0 {
		opts.Start = "$"
	}
	for {
		opts.Block = block
		records, next, err := c.Read(ctx, stream, opts)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		for _, r := range records {
			if err := enc.Encode(r); err != nil {
				return fmt.Errorf("write output: %w", err)
			}
		}
		// next names where this read ended in every partition, so records
		// appended while the last ones printed are read next, whichever
		// partition they went to.
		if next == "" {
			return fmt.Errorf("read stream %s: the server named no position to read on from", stream)
		}
		opts.Tail = 0
		opts.Start = next
	}
}

func newStreamGroupCmd(g *globals) *cobra.Command {
	cmd := newGroupCmd("group", "Create, list, inspect and delete a stream's consumer groups")

	var opts flo.GroupOptions
	create := &cobra.Command{
		Use:   "create STREAM GROUP",
		Short: "Create a consumer group",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if opts.MaxDeliveries < 0 {
				return errors.New("--max-deliveries must not be negative")
			}
			return g.withClient(func(c *flo.Client) error {
				group, err := c.CreateGroup(cmd.Context(), args[0], args[1], opts)
				if err != nil {
					return err
				}
				return printJSON(cmd, group)
			})
		},
	}
	create.Flags().StringVar(&opts.Start, "start", "-", "where the group starts: - (first record), $ (next record appended) or an id")
	create.Flags().IntVar(&opts.MaxDeliveries, "max-deliveries", 0, "deliveries before a record moves to STREAM.dlq (default 5)")
	create.Flags().StringVar(&opts.Mode, "mode", "", "how records spread over consumers: shared (default), exclusive (one consumer at a time) or key_shared (one consumer per key at a time, in order)")
	cmd.AddCommand(create)

	cmd.AddCommand(&cobra.Command{
		Use:   "list STREAM",
		Short: "List a stream's consumer groups with their lag and pending counts",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(func(c *flo.Client) error {
				groups, err := c.ListGroups(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				return printJSON(cmd, groups)
			})
		},
	})

	var pending flo.PendingOptions
	pendingCmd := &cobra.Command{
		Use:   "pending STREAM GROUP",
		Short: "List the records a group handed out and that are not acked yet, by partition and offset",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if pending.Limit < 0 {
				return errors.New("--limit must not be negative")
			}
			return g.withClient(func(c *flo.Client) error {
				entries, total, err := c.ListPending(cmd.Context(), args[0], args[1], pending)
				if err != nil {
					return err
				}
				return printJSON(cmd, struct {
					Total   int64               `json:"total"`
					Entries []*flo.PendingEntry `json:"entries"`
				}{total, entries})
			})
		},
	}
	pendingCmd.Flags().StringVar(&pending.Consumer, "consumer", "", "only this consumer's records")
	pendingCmd.Flags().IntVar(&pending.Limit, "limit", 0, "list at most this many (default: every one, fetched a page at a time)")
	cmd.AddCommand(pendingCmd)

	cmd.AddCommand(&cobra.Command{
		Use:   "delete STREAM GROUP",
		Short: "Delete a consumer group with its pending records; the stream's records stay",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withClient(func(c *flo.Client) error {
				if err := c.DeleteGroup(cmd.Context(), args[0], args[1]); err != nil {
					return err
				}
				return printJSON(cmd, map[string]string{"stream": args[0], "group": args[1], "status": "deleted"})
			})
		},
	})
	return cmd
}

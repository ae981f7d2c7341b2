package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"

	"github.com/razorbill/flo/libs/cmdline"
	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/services/dispatcher/internal/owner"
	"github.com/razorbill/flo/services/dispatcher/migrations"
)

// Repartitioned is what Repartition did (owner.Repartitioned).
type Repartitioned = owner.Repartitioned

// Repartition raises the partition count of the task topics to n while no
// dispatcher runs, bringing the schema up to date first: see
// owner.Repartition and docs/design/dispatch.md.
func Repartition(ctx context.Context, cfg Config, log *slog.Logger, n int32) (Repartitioned, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Postgres.URL == "" {
		return Repartitioned{}, errors.New("repartition: FLO_DATABASE_URL is required")
	}
	if len(cfg.Kafka.Brokers) == 0 {
		return Repartitioned{}, errors.New("repartition: FLO_KAFKA_BROKERS is required")
	}
	pool, err := pg.Open(ctx, cfg.Postgres.URL, Schema, 2, migrations.FS, log)
	if err != nil {
		return Repartitioned{}, fmt.Errorf("repartition: %w", err)
	}
	defer pool.Close()
	return owner.Repartition(ctx, cfg.Kafka, pool, log, n)
}

// RepartitionCommand is `dispatcher repartition N`: Repartition with the
// configuration serving reads.
func RepartitionCommand() cmdline.Command {
	return cmdline.Command{
		Name: "repartition", Args: "N",
		Help: "raise the task topics' partition count to N; every dispatcher stopped first",
		Run: func(ctx context.Context, args []string, stdout io.Writer) error {
			if len(args) != 1 {
				return fmt.Errorf("%w: repartition takes the new partition count, got %q", cmdline.ErrUsage, args)
			}
			n, err := strconv.ParseInt(args[0], 10, 32)
			if err != nil || n < 1 {
				return fmt.Errorf("%w: repartition: the partition count must be a positive number, got %q", cmdline.ErrUsage, args[0])
			}
			cfg, log, err := cmdline.Setup[Config](ctx, "dispatcher", stdout)
			if err != nil {
				return err
			}
			done, err := Repartition(ctx, cfg, log, int32(n))
			if err != nil {
				return err
			}
			// The outcome is the command's output, whatever the log level.
			_, err = fmt.Fprintf(stdout, "task topics repartitioned: %d partitions (were %d); %d task states written to the view first, %d tasks moved\n",
				done.To, done.From, done.Written, done.Moved)
			return err
		},
	}
}

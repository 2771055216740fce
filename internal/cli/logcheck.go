package cli

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
)

// The log's anchors (issue 13): `log head` prints the head an operator
// records somewhere else; `log verify --head SEQ:HASH` and `--checkpoint-file
// PATH` (the file bushostd serve --checkpoint-file appends to) hand the
// recorded heads to the broker, which checks each is still in the log.

func init() {
	register(&command{
		words: "log head",
		short: "print the log's head, to anchor it elsewhere",
		usage: "log head",
		help:  "Host: print the log's head, SEQ HASH (--json: {\"seq\":N,\"hash\":\"...\"}); record it off the machine and check it later with 'log verify --head SEQ:HASH'.",
		setup: runLogHead,
	})
}

func runLogHead(fs *pflag.FlagSet) runFunc {
	return brokerCall(func(ctx context.Context, e *Env, c brokerv1.BrokerServiceClient) error {
		r, err := c.LogHead(ctx, &brokerv1.LogHeadRequest{})
		if err != nil {
			return err
		}
		return printOut(e, fmt.Sprintf("%d %s", r.Seq, r.Hash), map[string]any{"seq": r.Seq, "hash": r.Hash})
	})
}

// parseHead reads "SEQ:HASH" or "SEQ HASH".
func parseHead(s string) (*brokerv1.RecordedHead, error) {
	s = strings.TrimSpace(s)
	seq, hash, ok := strings.Cut(s, ":")
	if !ok {
		seq, hash, ok = strings.Cut(s, " ")
	}
	n, err := strconv.ParseInt(seq, 10, 64)
	if !ok || err != nil || n < 1 || len(hash) != 64 || strings.Trim(hash, "0123456789abcdef") != "" {
		return nil, fmt.Errorf("%q is not a head: want SEQ:HASH, as 'bushost log head' prints it", s)
	}
	return &brokerv1.RecordedHead{Seq: n, Hash: hash}, nil
}

// recordedHeads gathers --head and the lines of --checkpoint-file. A last
// line without its newline is a write torn by a crash and is left out,
// as the daemon does.
func recordedHeads(head, checkpoint string) ([]*brokerv1.RecordedHead, error) {
	var out []*brokerv1.RecordedHead
	if head != "" {
		h, err := parseHead(head)
		if err != nil {
			return nil, usagef("--head: %v", err)
		}
		out = append(out, h)
	}
	if checkpoint == "" {
		return out, nil
	}
	f, err := os.Open(checkpoint)
	if err != nil {
		return nil, fmt.Errorf("checkpoint file: %w", err)
	}
	defer f.Close()
	br := bufio.NewReader(f)
	for n := 1; ; n++ {
		line, err := br.ReadString('\n')
		if err != nil {
			// io.EOF: a torn last line, or none.
			return out, nil
		}
		h, err := parseHead(line)
		if err != nil {
			return nil, fmt.Errorf("checkpoint file %s, line %d: %v", checkpoint, n, err)
		}
		out = append(out, h)
	}
}

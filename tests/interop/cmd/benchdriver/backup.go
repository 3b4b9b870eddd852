package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"

	"filippo.io/age"
	"github.com/klauspost/compress/zstd"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
)

// Parts of 5 MiB, two in flight: the shape of talosctl-rs's upload
// (talos_client::backup::PART_SIZE and PARTS_IN_FLIGHT), so that the two
// pipelines hold the same amount of upload data at a time. Without a part
// size minio-go would buffer parts of about 537 MiB for a stream of unknown
// length.
const (
	partSize      = 5 << 20
	partsInFlight = 2
)

// backup streams the node's etcd snapshot through zstd (klauspost's
// encoder at its default level, about zstd's 3), age (one X25519
// recipient) and a multipart upload to s3://BUCKET/KEY, with path-style
// addressing. The endpoint is AWS_ENDPOINT_URL, the credentials
// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, the region AWS_REGION
// (us-east-1 when unset). The only check of the snapshot is its size, as
// talosctl's: a multiple of 512 plus etcd's sha256 trailer.
func backup(ctx context.Context, c *client.Client, node, target, recipientText string) error {
	bucket, key, err := splitS3(target)
	if err != nil {
		return err
	}

	recipient, err := age.ParseX25519Recipient(recipientText)
	if err != nil {
		return err
	}

	s3, err := s3Client()
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	r, err := c.EtcdSnapshot(client.WithNodes(ctx, node), &machine.EtcdSnapshotRequest{})
	if err != nil {
		return err
	}

	defer r.Close() //nolint:errcheck

	body, sealed := io.Pipe()
	produced := make(chan error, 1)

	var plain int64

	go func() {
		n, err := compressAndSeal(sealed, r, recipient)
		plain = n

		if err == nil && n%512 != sha256.Size {
			err = fmt.Errorf("sha256 checksum not found (size %d)", n)
		}

		// A failed stream fails the upload too, which then aborts it.
		sealed.CloseWithError(err)
		produced <- err
	}()

	info, err := s3.PutObject(ctx, bucket, key, body, -1, minio.PutObjectOptions{
		ContentType:           "application/octet-stream",
		PartSize:              partSize,
		NumThreads:            partsInFlight,
		ConcurrentStreamParts: true,
	})
	if err != nil {
		body.CloseWithError(err)
		cancel()
		<-produced

		return err
	}

	if err = <-produced; err != nil {
		return err
	}

	fmt.Printf("etcd snapshot of %d bytes stored as s3://%s/%s (%d bytes, zstd, age)\n", plain, bucket, key, info.Size)

	return nil
}

// compressAndSeal copies the snapshot from r into zstd, whose output goes
// into age's writer for recipient, which writes into out. It returns the
// snapshot's size.
func compressAndSeal(out io.Writer, r io.Reader, recipient age.Recipient) (int64, error) {
	sealer, err := age.Encrypt(out, recipient)
	if err != nil {
		return 0, err
	}

	compressor, err := zstd.NewWriter(sealer)
	if err != nil {
		return 0, err
	}

	n, err := io.Copy(compressor, r)
	if err != nil {
		compressor.Close() //nolint:errcheck

		return n, err
	}

	if err = compressor.Close(); err != nil {
		return n, err
	}

	return n, sealer.Close()
}

func splitS3(target string) (bucket, key string, err error) {
	rest, ok := strings.CutPrefix(target, "s3://")
	if !ok {
		return "", "", fmt.Errorf("%q is not s3://BUCKET/KEY", target)
	}

	bucket, key, ok = strings.Cut(rest, "/")
	if !ok || bucket == "" || key == "" {
		return "", "", fmt.Errorf("%q is not s3://BUCKET/KEY", target)
	}

	return bucket, key, nil
}

func s3Client() (*minio.Client, error) {
	endpoint := os.Getenv("AWS_ENDPOINT_URL")
	if endpoint == "" {
		return nil, errors.New("AWS_ENDPOINT_URL is not set")
	}

	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, err
	}

	if u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("AWS_ENDPOINT_URL %q is not an http:// or https:// URL", endpoint)
	}

	region := os.Getenv("AWS_REGION")
	if region == "" {
		region = "us-east-1"
	}

	return minio.New(u.Host, &minio.Options{
		Creds:        credentials.NewStaticV4(os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY"), ""),
		Secure:       u.Scheme == "https",
		Region:       region,
		BucketLookup: minio.BucketLookupPath,
	})
}

package agent

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	stddraw "image/draw"
	"image/gif"
	"image/jpeg"
	"image/png"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"

	"golang.org/x/image/bmp"
	"golang.org/x/image/draw"
	"golang.org/x/image/tiff"
	"golang.org/x/image/webp"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// Images and raw bytes in the read tool.
//
// read tells an image from text by its first bytes, never by its name.
// An image comes back as MCP image content after a note that describes
// it. PNG, JPEG, GIF and WebP files within the limits pass byte for byte;
// others (BMP, TIFF) are converted to PNG, and images over the limits are
// decoded, scaled down and re-encoded (JPEG when opaque, PNG when they
// have transparency) until they fit. A JPEG or TIFF whose EXIF orientation
// is not "as stored" is always turned upright by the agent: many clients
// and model APIs ignore EXIF, and a model that sees a photo on its side
// misreads it and its coordinates.
//
// binary_base64 returns any file's bytes unprocessed, base64-encoded.

// Defaults of the media limits of toolboxConfig.
const (
	defaultImageMaxDimension = protocol.ImageMaxDimension
	defaultImageMaxBytes     = protocol.ImageMaxBytes
	defaultBinaryMaxBytes    = protocol.BinaryMaxBytes
)

// maxEncodedMedia is the most base64-encoded data a read may return, so
// that its result, notes included, fits protocol.MaxResultBytes;
// maxBinaryBytes the largest file whose encoding is that large.
const (
	maxEncodedMedia = protocol.MaxResultBytes - 1<<20
	maxBinaryBytes  = maxEncodedMedia / 4 * 3
)

// imageMaxPixels bounds the images read decodes: a decoded pixel takes 4
// to 8 bytes, and a small compressed file can claim a huge canvas.
const imageMaxPixels = 100_000_000

// imageMinDimension is the smallest ImageMaxDimension a host may set.
const imageMinDimension = 16

// imageHeadLen is how much of a file's start identifies an image format.
const imageHeadLen = 32

// setMediaDefaults fills in the media limits left at zero and refuses
// nonsensical ones.
func (c *toolboxConfig) setMediaDefaults() error {
	if c.ImageMaxDimension == 0 {
		c.ImageMaxDimension = defaultImageMaxDimension
	}
	if c.ImageMaxBytes == 0 {
		c.ImageMaxBytes = defaultImageMaxBytes
	}
	if c.BinaryMaxBytes == 0 {
		c.BinaryMaxBytes = defaultBinaryMaxBytes
	}
	switch {
	case c.ImageMaxDimension < imageMinDimension:
		return fmt.Errorf("toolbox: image max dimension %d is below %d pixels; use e.g. %d", c.ImageMaxDimension, imageMinDimension, defaultImageMaxDimension)
	case c.ImageMaxBytes < 1<<10:
		return fmt.Errorf("toolbox: image max bytes %d is below 1024; use e.g. %d", c.ImageMaxBytes, defaultImageMaxBytes)
	case c.BinaryMaxBytes < 1:
		return fmt.Errorf("toolbox: binary max bytes %d must be positive; use e.g. %d", c.BinaryMaxBytes, defaultBinaryMaxBytes)
	case c.BinaryMaxBytes > maxBinaryBytes:
		// Base64 makes data a third larger, and a gateway refuses a
		// result over protocol.MaxResultBytes.
		return fmt.Errorf("toolbox: binary max bytes %d (--binary_max_bytes) is above %d (%d MiB): base64-encoded, a read would not fit the fleet protocol's %d MiB result limit",
			c.BinaryMaxBytes, maxBinaryBytes, maxBinaryBytes>>20, protocol.MaxResultBytes>>20)
	case c.ImageMaxBytes > maxEncodedMedia:
		return fmt.Errorf("toolbox: image max bytes %d (--image_max_bytes) is above %d: an image would not fit the fleet protocol's %d MiB result limit",
			c.ImageMaxBytes, maxEncodedMedia, protocol.MaxResultBytes>>20)
	}
	return nil
}

// imageLimits are the limits an image is shown within.
type imageLimits struct {
	maxDim     int   // longest side shown, in pixels
	maxEncoded int   // largest image shown, in bytes once base64-encoded
	maxPixels  int64 // largest canvas decoded
}

func (t *toolbox) imageLimits() imageLimits {
	return imageLimits{maxDim: t.cfg.ImageMaxDimension, maxEncoded: t.cfg.ImageMaxBytes, maxPixels: imageMaxPixels}
}

// readMedia answers a read of an image file or one with binary_base64,
// given the file opened by openRegular and its size. It returns nil for
// any other file, which read then reads as text from the start (readMedia
// looks at the first bytes without moving the file's offset).
func (t *toolbox) readMedia(ctx context.Context, tc *toolCall, a *protocol.ReadArgs, path string, f *os.File, size int64) *protocol.Result {
	head := make([]byte, imageHeadLen)
	n, err := f.ReadAt(head, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		if a.BinaryBase64 {
			return toolFailure(tc, "%s", safefs.Problem(path, err))
		}
		return nil
	}
	format := sniffImage(head[:n])
	if format == nil && !a.BinaryBase64 {
		return nil
	}
	if a.Offset != 0 || a.Limit != 0 || a.Anchor != "" {
		what := "binary_base64 returns the whole file"
		if !a.BinaryBase64 {
			what = path + " is a " + format.label + " image"
		}
		return toolFailure(tc, "%s; offset, limit and anchor apply to text lines only: leave them out", what)
	}
	limit := t.cfg.BinaryMaxBytes
	if size > limit {
		return toolFailure(tc, "%s", tooLarge(path, format, a.BinaryBase64, size, limit))
	}
	data, err := readCapped(f, size, limit)
	switch {
	case errors.Is(err, errTooLarge):
		return toolFailure(tc, "%s", tooLarge(path, format, a.BinaryBase64, int64(len(data)), limit))
	case err != nil:
		return toolFailure(tc, "%s", safefs.Problem(path, err))
	case a.BinaryBase64:
		return rawResult(tc, path, data)
	}
	return t.imageResult(ctx, tc, path, data)
}

// tooLarge says that the file at path is over the read limit.
func tooLarge(path string, format *imageFormat, raw bool, size, limit int64) string {
	if raw || format == nil {
		return fmt.Sprintf("%s is %s (%d bytes); binary_base64 returns files up to %s (%d bytes, the host's --binary_max_bytes). Read part of it with bash (e.g. head -c, tail -c, od, base64).",
			path, humanSize(size), size, humanSize(limit), limit)
	}
	return fmt.Sprintf("%s is a %s image of %s (%d bytes); read takes images up to %s (the host's --binary_max_bytes). Make a smaller copy with bash (e.g. convert %s -resize 2000x2000 /tmp/small.jpg) and read that.",
		path, format.label, humanSize(size), size, humanSize(limit), shellQuote(path))
}

// errTooLarge reports a file that grew past the read limit while it was
// read.
var errTooLarge = errors.New("file over the read limit")

// readCapped reads f from its start: size bytes are expected, more than
// limit are refused with errTooLarge (and the first limit+1 bytes).
func readCapped(f *os.File, size, limit int64) ([]byte, error) {
	r := io.NewSectionReader(f, 0, limit+1)
	buf := make([]byte, 0, min(max(size, 0), limit)+1)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if int64(len(buf)) > limit {
		return buf, errTooLarge
	}
	return buf, nil
}

// openRegular opens target, the resolved path of path, for reading the
// way openText does (without following links, without waiting on a pipe)
// and returns it with its size. The file must be a regular file and not
// the agent's credentials under another name.
func (t *toolbox) openRegular(path, target, refusal string) (*os.File, int64, error) {
	return t.guard.openRegular(path, target, refusal)
}

// openRegular is toolbox.openRegular for what reads files outside a
// tool call (the skill catalog).
func (g *guard) openRegular(path, target, refusal string) (*os.File, int64, error) {
	if isRoot(target) {
		return nil, 0, problem(notRegular(path, fs.ModeDir, refusal))
	}
	d, err := safefs.OpenDir(filepath.Dir(target), false)
	if err != nil {
		return nil, 0, problem(safefs.Problem(path, err))
	}
	defer d.Close()
	name := filepath.Base(target)
	meta, err := d.Lstat(name)
	switch {
	case err != nil:
		return nil, 0, problem(safefs.Problem(path, err))
	case meta.Mode&fs.ModeSymlink != 0:
		return nil, 0, problem(safefs.Problem(path, safefs.ErrSwapped))
	}
	if p := notRegular(path, meta.Mode, refusal); p != "" {
		return nil, 0, problem(p)
	}
	f, err := d.OpenRead(name)
	if err != nil {
		return nil, 0, problem(safefs.Problem(path, err))
	}
	fi, err := f.Stat()
	if err == nil {
		if !safefs.OpenedRegular(fi) {
			err = problem(notRegular(path, fi.Mode(), refusal))
		} else {
			err = g.checkOpened(path, fi)
		}
	} else {
		err = problem(safefs.Problem(path, err))
	}
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, fi.Size(), nil
}

// rawResult returns data, the whole file at path, base64-encoded as text
// content: every MCP client passes text to the model, while embedded
// binary resources are dropped or shown as a placeholder by many.
func rawResult(tc *toolCall, path string, data []byte) *protocol.Result {
	sum := sha256Hex(data)
	note := fmt.Sprintf("%s: %d bytes (%s), sha256 %s. The next text item is its content, base64-encoded (standard alphabet, with padding).",
		path, len(data), humanSize(int64(len(data))), sum)
	r := &protocol.Result{CallID: tc.ID, Content: []protocol.Content{
		protocol.Text(note), protocol.Text(base64.StdEncoding.EncodeToString(data)),
	}}
	r.Structured, _ = json.Marshal(map[string]any{"path": path, "bytes": len(data), "sha256": sum, "encoding": "base64"})
	return r
}

// imageFormat is an image file format read knows.
type imageFormat struct {
	name  string // short name, as in the structured result: "png"
	label string // for messages: "PNG"
	mime  string
	// native formats are shown as they are when within the limits;
	// clients may not take the others, which are converted.
	native bool
	config func(io.Reader) (image.Config, error)
	decode func(io.Reader) (image.Image, error)
}

// sniffImage identifies the image format of a file by its first bytes
// (at least imageHeadLen of them unless the file is shorter); nil when
// they are not those of an image.
func sniffImage(head []byte) *imageFormat {
	switch {
	case bytes.HasPrefix(head, []byte("\x89PNG\r\n\x1a\n")):
		return &imageFormat{"png", "PNG", "image/png", true, png.DecodeConfig, png.Decode}
	case bytes.HasPrefix(head, []byte{0xFF, 0xD8, 0xFF}):
		return &imageFormat{"jpeg", "JPEG", "image/jpeg", true, jpeg.DecodeConfig, jpeg.Decode}
	case bytes.HasPrefix(head, []byte("GIF87a")) || bytes.HasPrefix(head, []byte("GIF89a")):
		return &imageFormat{"gif", "GIF", "image/gif", true, gif.DecodeConfig, gif.Decode}
	case len(head) >= 12 && string(head[:4]) == "RIFF" && string(head[8:12]) == "WEBP":
		return &imageFormat{"webp", "WebP", "image/webp", true, webp.DecodeConfig, webp.Decode}
	case isBMP(head):
		return &imageFormat{"bmp", "BMP", "image/bmp", false, bmp.DecodeConfig, bmp.Decode}
	case bytes.HasPrefix(head, []byte("II*\x00")) || bytes.HasPrefix(head, []byte("MM\x00*")):
		return &imageFormat{"tiff", "TIFF", "image/tiff", false, tiff.DecodeConfig, tiff.Decode}
	}
	return nil
}

// isBMP reports whether head starts a BMP file: "BM" alone is too weak
// (text can start so), so the size of the header that follows the file
// header must be one the format defines too.
func isBMP(head []byte) bool {
	if len(head) < 18 || head[0] != 'B' || head[1] != 'M' {
		return false
	}
	switch binary.LittleEndian.Uint32(head[14:]) {
	case 12, 40, 52, 56, 64, 108, 124:
		return true
	}
	return false
}

// imageProbe is what read learns of an image without decoding its pixels.
type imageProbe struct {
	format        *imageFormat
	width, height int // as stored
	orientation   int // EXIF orientation, 1 to 8
	animated      bool
}

// upright returns the image's size once its orientation is applied.
func (p imageProbe) upright() (w, h int) {
	if p.orientation >= 5 {
		return p.height, p.width
	}
	return p.width, p.height
}

// probeImage identifies data, the whole file at path, and reads its
// dimensions and orientation. Its errors are problems worded for the
// model. It decodes no pixels and allocates little whatever data holds.
func probeImage(path string, data []byte, maxPixels int64) (imageProbe, error) {
	f := sniffImage(data[:min(len(data), imageHeadLen)])
	if f == nil {
		return imageProbe{}, problem(path + " is not an image this tool reads (PNG, JPEG, GIF, WebP, BMP, TIFF); use binary_base64=true for its raw bytes")
	}
	p := imageProbe{format: f, orientation: 1}
	switch f.name {
	case "png":
		if apngAnimated(data) {
			return p, problem(path + " is an animated PNG (APNG); read shows still images only. Use binary_base64=true for its raw bytes, or extract a frame with bash (e.g. ffmpeg -i " + shellQuote(path) + " -frames:v 1 /tmp/frame.png) and read that.")
		}
	case "gif":
		p.animated = gifFrames(data) > 1
	case "webp":
		// The extended header's animation flag (see the WebP container
		// specification).
		p.animated = len(data) >= 21 && string(data[12:16]) == "VP8X" && data[20]&0x02 != 0
	case "jpeg":
		p.orientation = jpegOrientation(data)
	case "tiff":
		p.orientation = max(tiffOrientation(data), 1)
	}
	cfg, err := f.config(bytes.NewReader(data))
	if err != nil {
		return p, problem(fmt.Sprintf("%s looks like a %s image by its first bytes, but its header does not decode (%v). Use binary_base64=true for its raw bytes.", path, f.label, err))
	}
	if cfg.Width <= 0 || cfg.Height <= 0 {
		return p, problem(fmt.Sprintf("%s is a %s image of %dx%d pixels, which is empty. Use binary_base64=true for its raw bytes.", path, f.label, cfg.Width, cfg.Height))
	}
	p.width, p.height = cfg.Width, cfg.Height
	if px := int64(cfg.Width) * int64(cfg.Height); px > maxPixels {
		return p, problem(fmt.Sprintf("%s is a %s image of %dx%d pixels (%.1f megapixels); read decodes images up to %d megapixels. Make a smaller copy with bash (e.g. convert %s -resize 2000x2000 /tmp/small.jpg) and read that, or use binary_base64=true for its raw bytes.",
			path, f.label, cfg.Width, cfg.Height, float64(px)/1e6, maxPixels/1_000_000, shellQuote(path)))
	}
	return p, nil
}

// apngAnimated reports whether the PNG file b has an animation control
// chunk (acTL) before its image data, which makes it an animated PNG.
func apngAnimated(b []byte) bool {
	for p := 8; p+8 <= len(b); {
		n := uint64(binary.BigEndian.Uint32(b[p:]))
		switch string(b[p+4 : p+8]) {
		case "acTL":
			return true
		case "IDAT", "IEND":
			return false
		}
		next := uint64(p) + 12 + n
		if next > uint64(len(b)) {
			return false
		}
		p = int(next)
	}
	return false
}

// gifFrames counts the frames of the GIF file b, stopping at 2.
func gifFrames(b []byte) int {
	if len(b) < 13 {
		return 0
	}
	p := 13
	if b[10]&0x80 != 0 { // global colour table
		p += 3 << (b[10]&7 + 1)
	}
	frames := 0
	for p < len(b) && frames < 2 {
		switch b[p] {
		case 0x21: // extension: label, then data sub-blocks
			p = skipSubBlocks(b, p+2)
		case 0x2C: // image descriptor, colour table, LZW code size, data
			frames++
			if p+10 > len(b) {
				return frames
			}
			flags := b[p+9]
			p += 10
			if flags&0x80 != 0 {
				p += 3 << (flags&7 + 1)
			}
			p = skipSubBlocks(b, p+1)
		default: // trailer, or not GIF
			return frames
		}
	}
	return frames
}

// skipSubBlocks returns the offset after the GIF data sub-blocks at p.
func skipSubBlocks(b []byte, p int) int {
	for p < len(b) {
		n := int(b[p])
		p++
		if n == 0 {
			return p
		}
		p += n
	}
	return p
}

// shownImage is the image read returns for a file.
type shownImage struct {
	data          []byte
	format        string // "png", "jpeg"... as in imageFormat.name
	mime          string
	width, height int
	asIs          bool // the file's own bytes
}

// fitsAsIs reports whether the file data, of probe p, can be shown as it
// is within lim.
func fitsAsIs(p imageProbe, data []byte, lim imageLimits) bool {
	return p.format.native && p.orientation == 1 &&
		max(p.width, p.height) <= lim.maxDim &&
		base64.StdEncoding.EncodedLen(len(data)) <= lim.maxEncoded
}

// imageResult shows data, the image file at path.
func (t *toolbox) imageResult(ctx context.Context, tc *toolCall, path string, data []byte) *protocol.Result {
	lim := t.imageLimits()
	p, err := probeImage(path, data, lim.maxPixels)
	if err != nil {
		return toolFailure(tc, "%s", err.Error())
	}
	var shown shownImage
	if fitsAsIs(p, data, lim) {
		shown = shownImage{data: data, format: p.format.name, mime: p.format.mime, width: p.width, height: p.height, asIs: true}
	} else {
		// One conversion at a time: each holds the decoded canvas (4
		// bytes a pixel, up to imageMaxPixels) and the work is CPU-bound.
		select {
		case t.imageSem <- struct{}{}:
		case <-ctx.Done():
			return protocol.ErrorResult(tc.ID, protocol.CodeCancelled, "read "+path+": cancelled")
		}
		shown, err = convertImage(ctx, path, data, p, lim)
		<-t.imageSem
	}
	switch {
	case ctx.Err() != nil:
		return protocol.ErrorResult(tc.ID, protocol.CodeCancelled, "read "+path+": cancelled")
	case err != nil:
		return toolFailure(tc, "%s", err.Error())
	}
	sum := sha256Hex(data)
	r := &protocol.Result{CallID: tc.ID, Content: []protocol.Content{
		protocol.Text(imageNote(path, int64(len(data)), sum, p, shown, lim)),
		{Type: "image", MIMEType: shown.mime, Data: shown.data},
	}}
	r.Structured, _ = json.Marshal(imageStructured(path, int64(len(data)), sum, p, shown))
	return r
}

// imageNote describes the file and the image shown, and how coordinates
// on the one map to the other.
func imageNote(path string, size int64, sum string, p imageProbe, s shownImage, lim imageLimits) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s: %s image, %dx%d, %s, sha256 %s.", path, p.format.label, p.width, p.height, humanSize(size), sum)
	uw, uh := p.upright()
	if p.orientation != 1 {
		fmt.Fprintf(&b, " Its EXIF orientation %d was applied: upright it is %dx%d.", p.orientation, uw, uh)
	}
	switch {
	case s.asIs && p.animated:
		fmt.Fprintf(&b, " Shown as is (animated; a client may show only the first frame).")
	case s.asIs:
		fmt.Fprintf(&b, " Shown as is: coordinates on it are the file's pixels.")
	case s.width == uw && s.height == uh:
		fmt.Fprintf(&b, " Shown as a %dx%d %s (converted, same size): coordinates on it are the upright image's pixels.", s.width, s.height, s.mimeLabel())
	default:
		var why string
		switch long := max(s.width, s.height); {
		case long >= min(max(uw, uh), lim.maxDim):
			why = fmt.Sprintf("scaled to fit %d px", lim.maxDim)
		case max(uw, uh) <= lim.maxDim:
			why = fmt.Sprintf("scaled to fit %s once base64-encoded", humanSize(int64(lim.maxEncoded)))
		default:
			why = fmt.Sprintf("scaled to fit %d px and %s once base64-encoded", lim.maxDim, humanSize(int64(lim.maxEncoded)))
		}
		sx, sy := float64(uw)/float64(s.width), float64(uh)/float64(s.height)
		fmt.Fprintf(&b, " Shown as a %dx%d %s (%s). To map a point (x, y) on the shown image to the upright original, multiply x by %.4g and y by %.4g.",
			s.width, s.height, s.mimeLabel(), why, sx, sy)
	}
	if p.animated && !s.asIs {
		fmt.Fprintf(&b, " The file is animated: only its first frame is shown.")
	}
	return b.String()
}

func (s shownImage) mimeLabel() string {
	if s.format == "jpeg" {
		return "JPEG"
	}
	return "PNG"
}

// imageStructured is the structured result of an image read.
func imageStructured(path string, size int64, sum string, p imageProbe, s shownImage) map[string]any {
	uw, uh := p.upright()
	return map[string]any{
		"path":        path,
		"format":      p.format.name,
		"bytes":       size,
		"sha256":      sum,
		"width":       p.width,
		"height":      p.height,
		"orientation": p.orientation,
		"animated":    p.animated,
		"shown": map[string]any{
			"format": s.format, "mime_type": s.mime, "width": s.width, "height": s.height,
			"bytes": len(s.data), "as_is": s.asIs,
		},
		// Multiply a coordinate on the shown image by these to get one on
		// the upright original.
		"scale_x": float64(uw) / float64(s.width),
		"scale_y": float64(uh) / float64(s.height),
	}
}

// imageMaxTries bounds the encodings convertImage tries.
const imageMaxTries = 8

// convertImage decodes data, the file at path of probe p, turns it
// upright, scales it to fit lim.maxDim and encodes it: JPEG (quality 85)
// when it is opaque, PNG when it has transparency, and PNG first for an
// opaque BMP or TIFF shown at full size. While the result is over
// lim.maxEncoded it steps the JPEG quality down to 70, then the size down
// by a quarter, at most imageMaxTries encodings in all.
func convertImage(ctx context.Context, path string, data []byte, p imageProbe, lim imageLimits) (shownImage, error) {
	if p.format.name == "webp" && p.animated {
		return shownImage{}, problem(fmt.Sprintf("%s is an animated WebP image of %dx%d, %s, over the limits it could be shown as is within (%d px, %s once base64-encoded), and animated WebP cannot be decoded here. Use binary_base64=true for its raw bytes, or extract a frame with bash and read that.",
			path, p.width, p.height, humanSize(int64(len(data))), lim.maxDim, humanSize(int64(lim.maxEncoded))))
	}
	// The decoders read as they go: a cancelled call stops them.
	br := bytes.NewReader(data)
	m, err := p.format.decode(ctxReaderAt{ctxReader{ctx, br}, br})
	if ctx.Err() != nil {
		return shownImage{}, ctx.Err()
	}
	if err != nil {
		return shownImage{}, problem(fmt.Sprintf("%s is a %s image of %dx%d but does not decode (%v). Use binary_base64=true for its raw bytes.", path, p.format.label, p.width, p.height, err))
	}
	if ctx.Err() != nil {
		return shownImage{}, ctx.Err()
	}
	canvas := toRGBA(m, p.width, p.height)
	// Ask the decoded image when it covers the canvas: a JPEG's YCbCr
	// answers without a scan.
	var opaque bool
	if o, ok := m.(interface{ Opaque() bool }); ok && m.Bounds().Eq(canvas.Rect) {
		opaque = o.Opaque()
	} else {
		opaque = canvas.Opaque()
	}
	scale := min(1, float64(lim.maxDim)/float64(max(p.width, p.height)))
	asPNG := !opaque || scale == 1 && !p.format.native
	quality := 85
	var shown *image.RGBA
	shownScale := 0.0
	var w, h int
	var enc []byte
	for range imageMaxTries {
		if ctx.Err() != nil {
			return shownImage{}, ctx.Err()
		}
		if scale != shownScale {
			w, h = scaled(p.width, scale), scaled(p.height, scale)
			shown, shownScale = orient(resize(ctx, canvas, w, h), p.orientation), scale
		}
		if enc, err = encodeImage(ctx, shown, asPNG, quality); err != nil {
			if ctx.Err() != nil {
				return shownImage{}, ctx.Err()
			}
			return shownImage{}, fmt.Errorf("encode %s: %w", path, err)
		}
		if base64.StdEncoding.EncodedLen(len(enc)) <= lim.maxEncoded {
			s := shownImage{data: enc, format: "jpeg", mime: "image/jpeg", width: shown.Rect.Dx(), height: shown.Rect.Dy()}
			if asPNG {
				s.format, s.mime = "png", "image/png"
			}
			return s, nil
		}
		switch {
		case asPNG && opaque:
			asPNG = false
		case !asPNG && quality > 70:
			quality = 70
		default:
			scale *= 0.75
		}
	}
	return shownImage{}, problem(fmt.Sprintf("%s (%s image, %dx%d): even at %dx%d it takes %s once base64-encoded, over the %s limit. Crop or shrink it with bash (e.g. convert %s -resize 800x800 /tmp/small.jpg) and read that, or use binary_base64=true for its raw bytes.",
		path, p.format.label, p.width, p.height, shown.Rect.Dx(), shown.Rect.Dy(), humanSize(int64(base64.StdEncoding.EncodedLen(len(enc)))), humanSize(int64(lim.maxEncoded)), shellQuote(path)))
}

// scaled returns n scaled by f, rounded, at least 1.
func scaled(n int, f float64) int {
	return max(1, int(math.Round(float64(n)*f)))
}

// toRGBA draws m on a w by h canvas at the origin. A GIF's first frame
// can be smaller than its canvas; what it leaves uncovered is
// transparent.
func toRGBA(m image.Image, w, h int) *image.RGBA {
	canvas := image.NewRGBA(image.Rect(0, 0, w, h))
	r := m.Bounds().Intersect(canvas.Rect)
	stddraw.Draw(canvas, r, m, r.Min, stddraw.Src)
	return canvas
}

// resize scales src down to w by h. It first averages k by k blocks,
// for the largest whole k that keeps the image at least w by h (what
// area averaging does well and fast), then resamples the rest of the way
// with Catmull-Rom, which keeps edges and text sharp. Resampling all the
// way costs five times as much for no visible gain; bilinear
// interpolation alone is as fast but aliases fine detail (thin lines,
// text) at ratios over 1.5. The block average ignores the last
// (width mod k) columns and (height mod k) rows, under k pixels.
func resize(ctx context.Context, src *image.RGBA, w, h int) *image.RGBA {
	sw, sh := src.Rect.Dx(), src.Rect.Dy()
	if k := min(sw/w, sh/h); k >= 2 {
		src = shrinkBox(ctx, src, k)
		sw, sh = src.Rect.Dx(), src.Rect.Dy()
	}
	if sw == w && sh == h {
		return src
	}
	dst := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.CatmullRom.Scale(dst, dst.Rect, src, src.Rect, draw.Src, nil)
	return dst
}

// shrinkBox averages the k by k blocks of src, an image at the origin.
// It stops early, leaving the rest of the image blank, when ctx ends
// (the caller checks ctx and throws the image away).
func shrinkBox(ctx context.Context, src *image.RGBA, k int) *image.RGBA {
	w, h := src.Rect.Dx()/k, src.Rect.Dy()/k
	dst := image.NewRGBA(image.Rect(0, 0, w, h))
	n := uint32(k * k)
	sum := make([]uint32, w*4)
	for y := range h {
		if y%64 == 0 && ctx.Err() != nil {
			break
		}
		clear(sum)
		for yy := range k {
			row := src.Pix[(y*k+yy)*src.Stride:]
			for x := range w {
				px := row[x*k*4 : (x+1)*k*4]
				s := sum[x*4 : x*4+4 : x*4+4]
				for i := 0; i < len(px); i += 4 {
					s[0] += uint32(px[i])
					s[1] += uint32(px[i+1])
					s[2] += uint32(px[i+2])
					s[3] += uint32(px[i+3])
				}
			}
		}
		out := dst.Pix[y*dst.Stride : y*dst.Stride+w*4]
		for i, s := range sum {
			out[i] = uint8((s + n/2) / n)
		}
	}
	return dst
}

// orient turns src, an image at the origin, upright for EXIF orientation
// o (see exif.go).
func orient(src *image.RGBA, o int) *image.RGBA {
	if o <= 1 || o > 8 {
		return src
	}
	w, h := src.Rect.Dx(), src.Rect.Dy()
	dw, dh := w, h
	if o >= 5 {
		dw, dh = h, w
	}
	dst := image.NewRGBA(image.Rect(0, 0, dw, dh))
	for y := range dh {
		row := dst.Pix[y*dst.Stride:]
		for x := range dw {
			// The stored pixel that shows at (x, y) once upright.
			var sx, sy int
			switch o {
			case 2:
				sx, sy = w-1-x, y
			case 3:
				sx, sy = w-1-x, h-1-y
			case 4:
				sx, sy = x, h-1-y
			case 5:
				sx, sy = y, x
			case 6:
				sx, sy = y, h-1-x
			case 7:
				sx, sy = w-1-y, h-1-x
			case 8:
				sx, sy = w-1-y, x
			}
			copy(row[x*4:x*4+4], src.Pix[sy*src.Stride+sx*4:])
		}
	}
	return dst
}

// encodeImage encodes m as PNG or as JPEG of the given quality. The
// encoders write as they go: a cancelled call stops them.
func encodeImage(ctx context.Context, m *image.RGBA, asPNG bool, quality int) ([]byte, error) {
	var b bytes.Buffer
	w := ctxWriter{ctx, &b}
	var err error
	if asPNG {
		err = png.Encode(w, m)
	} else {
		err = jpeg.Encode(w, m, &jpeg.Options{Quality: quality})
	}
	return b.Bytes(), err
}

#!/usr/bin/env python3
"""sendump2mixw.py - expand PocketSphinx's quantised `sendump` into a Sphinx-3
`mixture_weights` file, so that SphinxTrain (bw, map_adapt, mllr_solve) can
adapt the model. Debian's pocketsphinx-en-us ships only `sendump`; the full
model with `mixture_weights` is not packaged. Pure Python 3 (no numpy), about
1 s for en-us (5126 senones x 3 streams x 128 densities, 7.9 MB out).

Used by adapt.sh. Usage:
    sendump2mixw.py SENDUMP OUT_MIXTURE_WEIGHTS [--no-norm]

Input: `sendump` (byte order detected from the first length word)
    header   repeated {int32 len; len bytes: a NUL-terminated string}, ended
             by int32 0. Strings of the form "key value" are read; used keys:
             feature_count (streams, default 1), mixw_shift (default 10),
             cluster_count (must be absent or 0: clustered dumps are refused)
    sizes    int32 n_density, int32 n_senone
    body     for each stream, for each density: n_senone uint8 values v
             (optionally preceded by up to 3 padding bytes)
    weight   w = 1.0001 ** -(v << mixw_shift)  (a negated log-1.0001 value)
  Each senone's per-stream distribution is renormalised to sum to 1 (the
  8-bit quantisation leaves it slightly off); --no-norm keeps the raw values.

Output: Sphinx-3 binary 3-d float array (little endian), as sphinxbase's
bio.c reads it
    "s3\\nversion 1.0\\nchksum0 yes\\nendhdr\\n"   text header
    uint32 0x11223344                            byte-order mark
    uint32 n_senone, n_stream, n_density, uint32 n = their product
    float32[n]                                   senone-major: [s][f][d]
    uint32 checksum: over the 4 size words and the data words,
                     c = rotl(c, 20) + word  (mod 2**32), starting at 0
"""
import argparse
import struct
import sys
from array import array


class SendumpError(Exception):
    pass


def read_sendump(path):
    """Returns (header dict, n_stream, n_density, n_senone, mixw_shift, body)."""
    with open(path, 'rb') as f:
        data = f.read()
    if len(data) < 4:
        raise SendumpError('%s: too short for a sendump' % path)
    # The first word is a short string length: pick the order that makes it so.
    little = struct.unpack_from('<i', data, 0)[0]
    order = '<' if 0 <= little <= 65536 else '>'
    pos = 0

    def int32():
        nonlocal pos
        if pos + 4 > len(data):
            raise SendumpError('%s: truncated header' % path)
        (v,) = struct.unpack_from(order + 'i', data, pos)
        pos += 4
        return v

    header = {}
    while True:
        n = int32()
        if n == 0:
            break
        if n < 0 or pos + n > len(data):
            raise SendumpError('%s: bad header string length %d' % (path, n))
        text = data[pos:pos + n].rstrip(b'\0').decode('latin-1')
        pos += n
        key, _, value = text.partition(' ')
        if value.lstrip('-').isdigit():
            header[key] = int(value)
    if header.get('cluster_count', 0):
        raise SendumpError('%s: clustered sendump (cluster_count > 0) is not supported' % path)
    n_stream = header.get('feature_count', 1)
    mixw_shift = header.get('mixw_shift', 10)
    n_density = int32()
    n_senone = int32()
    need = n_stream * n_density * n_senone
    extra = len(data) - pos - need
    if extra < 0 or extra > 3:
        raise SendumpError('%s: body is %d bytes, expected %d (%d streams x %d densities x '
                           '%d senones)' % (path, len(data) - pos, need, n_stream, n_density,
                                            n_senone))
    pos += extra  # alignment padding some writers put before the body
    return header, n_stream, n_density, n_senone, mixw_shift, memoryview(data)[pos:pos + need]


def expand(n_stream, n_density, n_senone, mixw_shift, body, normalise):
    """Stream/density/senone-major uint8 -> senone/stream/density-major floats."""
    weight = [1.0001 ** -(v << mixw_shift) for v in range(256)]
    out = array('f', bytes(4 * n_senone * n_stream * n_density))
    senone_stride = n_stream * n_density
    for f in range(n_stream):
        for d in range(n_density):
            row = body[(f * n_density + d) * n_senone:(f * n_density + d + 1) * n_senone]
            o = f * n_density + d
            for s, v in enumerate(row):
                out[s * senone_stride + o] = weight[v]
    if normalise:
        for start in range(0, len(out), n_density):
            total = sum(out[start:start + n_density])
            if total > 0:
                for k in range(start, start + n_density):
                    out[k] /= total
    return out


def write_s3_float3d(path, values, d1, d2, d3):
    if sys.byteorder != 'little':
        raise SendumpError('this writer assumes a little-endian host')
    words = array('I', [d1, d2, d3, d1 * d2 * d3])
    words.frombytes(values.tobytes())
    checksum = 0
    for w in words:
        checksum = (((checksum << 20) | (checksum >> 12)) + w) & 0xFFFFFFFF
    with open(path, 'wb') as f:
        f.write(b's3\nversion 1.0\nchksum0 yes\nendhdr\n')
        f.write(struct.pack('<I', 0x11223344))
        f.write(words.tobytes())
        f.write(struct.pack('<I', checksum))


def main():
    p = argparse.ArgumentParser(description='Expand a PocketSphinx sendump into a Sphinx-3 '
                                'mixture_weights file.')
    p.add_argument('sendump')
    p.add_argument('out')
    p.add_argument('--no-norm', action='store_true',
                   help='do not renormalise each distribution to sum to 1')
    a = p.parse_args()
    try:
        _, nf, nd, ns, shift, body = read_sendump(a.sendump)
        values = expand(nf, nd, ns, shift, body, normalise=not a.no_norm)
        write_s3_float3d(a.out, values, ns, nf, nd)
    except (OSError, SendumpError) as e:
        print('sendump2mixw: %s' % e, file=sys.stderr)
        return 1
    print('sendump2mixw: %d senones x %d streams x %d densities (mixw_shift %d) -> %s'
          % (ns, nf, nd, shift, a.out), file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
